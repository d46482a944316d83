package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/mcpwire"
)

// maxReplayBody is the largest POST body, in bytes, of a session that can
// fail over which the proxy keeps while the request is in flight, so that
// it can send the request again after the upstream answered it 404. A
// larger POST that gets 404 is answered 404 and ends the session. MCP
// messages are small; 1 MiB bounds the memory of a request in flight.
const maxReplayBody = 1 << 20

// failover fails the sessions of one mcp_session handler over: it keeps
// what a session's requests need to be sent again, replays the session's
// kept initialize on another upstream, and records the move in the table.
// The handler decides when (serveFailover); failover does the moving.
type failover struct {
	table    *session.Table
	logger   *zap.Logger
	maxIDLen int // the handler's max_session_id_length
}

// debug logs msg at debug level for session id, as [Handler.debug] does.
func (f *failover) debug(msg, id, upstream string, fields ...zap.Field) {
	logDebug(f.logger, msg, id, upstream, fields...)
}

// errNoFailover is why a replayed initialize was refused.
var errNoFailover = errors.New("no upstream took the replayed initialize")

// captureInit reads the body of a POST without a session, when the table
// fails sessions over, and returns what the table keeps of it if it is an
// initialize request within max_initialize_size; nil otherwise. The body
// passes on unchanged.
func (f *failover) captureInit(r *http.Request) *session.Init {
	fs := f.table.Failover()
	if !fs.On || r.Method != http.MethodPost || r.Body == nil || r.Body == http.NoBody || r.ContentLength > int64(fs.MaxInit) {
		return nil
	}
	if m := r.Header.Get(HeaderMethod); m != "" && m != "initialize" {
		return nil
	}
	buf, whole, err := exchangeOf(r).readHead(r, int64(fs.MaxInit))
	if err != nil || !whole || !isInitialize(buf, false) {
		return nil
	}
	return &session.Init{
		Body:        bytes.Clone(buf),
		Accept:      r.Header.Get("Accept"),
		ContentType: r.Header.Get("Content-Type"),
		Version:     r.Header.Get(HeaderProtocolVersion),
	}
}

// isInitialize reports whether body, or its first bytes, is an initialize
// request, or with batch a batch holding one: internal/mcpwire's
// IsInitialize, which reads it as the mcp matcher does.
func isInitialize(body []byte, batch bool) bool { return mcpwire.IsInitialize(body, batch) }

// pinnedFailover is what a pinned request of a session that can fail over
// carries: the session's kept initialize, the ID its upstream knows it by,
// and the request's body, kept to send it again after an upstream 404.
type pinnedFailover struct {
	init   *session.Init
	again  bool   // the request may fail over: it has not yet
	sent   string // the Mcp-Session-Id sent to the upstream
	body   []byte // the whole body of a POST; nil if none or too large to keep
	kept   bool   // body holds the whole body
	held   bool   // the upstream answered 404, which was held back
	header http.Header
}

// failoverRefused returns why the session id of request r may not fail
// over, or "" if it may: it ended or expired here (a tombstone), or its
// sealed ID is older than failover_max_age or does not say its age. The
// shared store's word comes later, in failOver.
func (f *failover) failoverRefused(r *http.Request, id string) session.Refusal {
	switch f.table.Buried(id) {
	case session.TombEnded:
		return session.RefusedEnded
	case session.TombExpired:
		return session.RefusedExpired
	}
	if ex := exchangeOf(r); ex.sealed {
		if ex.issued == 0 {
			return session.RefusedUnknownAge
		}
		if time.Since(time.Unix(ex.issued, 0)) > f.table.FailoverMaxAge() {
			return session.RefusedTooOld
		}
	}
	return ""
}

// failoverFor returns what a pinned request of session id needs to fail
// over, and sets the Mcp-Session-Id it sends to the one its upstream knows;
// nil when the table does not fail sessions over or the session has no kept
// initialize. A request that failed over once may not again.
func (f *failover) failoverFor(w http.ResponseWriter, r *http.Request, id string) *pinnedFailover {
	if !f.table.Failover().On {
		return nil
	}
	_, init := f.table.InitOf(id)
	if init == nil {
		return nil
	}
	if init.UpstreamID != "" {
		r.Header[HeaderSessionID] = []string{init.UpstreamID}
	}
	pf := &pinnedFailover{init: init, again: !exchangeOf(r).failedOver, sent: r.Header.Get(HeaderSessionID)}
	if pf.again {
		pf.header = w.Header().Clone()
		if r.Method == http.MethodPost {
			pf.keepBody(r)
		} else {
			pf.kept = true // only a POST's body is sent again
		}
	}
	return pf
}

// keepBody reads r's body, up to maxReplayBody, so that it can be sent again.
func (pf *pinnedFailover) keepBody(r *http.Request) {
	if r.Body == nil || r.Body == http.NoBody {
		pf.kept = true
		return
	}
	if r.ContentLength > maxReplayBody {
		return
	}
	// A body the budget has no room for is not kept: the request is sent
	// once, as a larger one is.
	buf, whole, err := exchangeOf(r).readHead(r, maxReplayBody)
	if err == nil && whole {
		pf.body, pf.kept = buf, true
		r.Body = io.NopCloser(bytes.NewReader(buf))
	}
}

// holds404 reports whether a response of status to r, from upstream up,
// must be held back: a 404 that means the session is unknown there, which
// a failover can answer instead. That is a 404 to a POST, or to a GET when
// up has served a session's GET stream before: an upstream without a GET
// route answers every GET 404 (see evictAfter), which must not move its
// sessions away.
func (pf *pinnedFailover) holds404(r *http.Request, up *session.Upstream, status int) bool {
	if pf == nil || !pf.again || status != http.StatusNotFound {
		return false
	}
	return r.Method == http.MethodPost || r.Method == http.MethodGet && up.ServedStream()
}

// cause returns why the request must fail over after the upstream
// answered, or reverse_proxy returned err, with nothing written; 0 when it
// must not: it reached an upstream, or its upstream is only unavailable.
func (pf *pinnedFailover) cause(r *http.Request, err error, wrote bool, dial string) session.FailoverCause {
	switch {
	case pf == nil || !pf.again || r.Method == http.MethodDelete:
		return 0 // a DELETE of a gone session ends it: nothing to move
	case pf.held:
		return session.FailoverUpstream404
	case err == nil || wrote:
		return 0
	}
	ex := exchangeOf(r)
	if ex.unavailable > 0 && !refused(r, dial) {
		return 0
	}
	if ex.gone {
		return session.FailoverGone
	}
	if upstreamGone(r, err, dial) {
		return session.FailoverRefused
	}
	return 0
}

// failOver moves session id, which the request found on upstream from
// under the ID pf.sent, to another upstream for cause, and returns r
// prepared to be sent there (see prepareRetry). Concurrent requests of the session share one failover; a
// request that finds the session moved already follows it.
func (f *failover) failOver(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, id string, from *session.Upstream, pf *pinnedFailover, cause session.FailoverCause) (*session.Upstream, *http.Request, error) {
	v, err := f.table.Flight(id, func() (any, error) {
		// Moved by a request before this one: the kept record changed, or,
		// when this request looked the session up before that move and read
		// its record after (servePinned does the two apart), the upstream
		// did. Failing over again would open a second upstream session and
		// orphan the first.
		if up, init := f.table.InitOf(id); up != nil && init != nil && (init != pf.init || up != from) {
			return session.FailoverResult{Up: up, Init: init}, nil
		}
		// A DELETE may have ended the session while this request was on
		// its way, here or, as the store says, on another instance.
		var err error
		if why := f.failoverRefused(r, id); why != "" {
			err = why
		}
		var res session.FailoverResult
		if err == nil {
			var moved, ended bool
			if res, moved, ended = f.table.MovedInStore(id, from, pf.init); ended {
				err = session.RefusedGone
			} else if !moved {
				res, err = f.reinitialize(r, next, id, from, pf.init, cause != session.FailoverUpstream404)
			}
		}
		f.table.Stats.CountFailover(cause, session.FailoverOutcome(res, err))
		f.logFailover(id, from, res, cause, err)
		return res, err
	})
	if err != nil {
		return nil, nil, err
	}
	res := v.(session.FailoverResult)
	return res.Up, f.prepareRetry(w, r, pf, res.Init.UpstreamID), nil
}

// reinitialize replays the session's initialize on an upstream the
// fallback policy picks, never on from when leaving (from is gone or
// draining, not just restarted: it did not answer 404), then sends
// notifications/initialized there, and records the new upstream and its
// session ID.
func (f *failover) reinitialize(r *http.Request, next caddyhttp.Handler, id string, from *session.Upstream, init *session.Init, leaving bool) (session.FailoverResult, error) {
	want := r.Header.Get(HeaderProtocolVersion)
	body := atVersion(init.Body, want)
	asked := requestedVersion(body)
	ir := subrequest(r, body)
	setInitHeaders(ir.Header, init)
	ex := exchangeOf(ir)
	ex.replay = true
	if leaving {
		ex.noteFailed(from.Dial())
	}
	var skipped []string // upstreams that opened the session at another version
	for {
		var to *session.Upstream
		var newID, version string
		var err error
		ir, to, newID, version, err = f.replayOnce(r, next, ir, body)
		switch {
		case err != nil && len(skipped) > 0:
			return session.FailoverResult{}, fmt.Errorf("%w: %s; every other upstream that answered negotiated another protocol version than the session's %s (%s)",
				errNoFailover, err, sessionVersion(want), strings.Join(skipped, ", "))
		case err != nil:
			return session.FailoverResult{}, err
		case !sameVersion(want, asked, version):
			// The client keeps sending its negotiated MCP-Protocol-Version:
			// an upstream of another version would refuse every request.
			f.endOrphan(r, next, to, newID, version)
			skip := to.Dial() + " negotiated " + version
			if slices.Contains(skipped, skip) { // the policy has nothing else
				return session.FailoverResult{}, fmt.Errorf("%w: every upstream that answered negotiated another protocol version than the session's %s (%s)",
					errNoFailover, sessionVersion(want), strings.Join(skipped, ", "))
			}
			skipped = append(skipped, skip)
			ir = withOwnVars(ir)
			clearSelection(ir)
			ir.Body, ir.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
			continue
		}
		if err := f.notifyInitialized(r, next, to, newID, version); err != nil {
			f.endOrphan(r, next, to, newID, version)
			return session.FailoverResult{}, err
		}
		res, err := f.table.RecordMove(id, from, init, to, init.MovedTo(newID))
		if err != nil || res.Followed { // no client will use the new upstream session
			f.endOrphan(r, next, to, newID, version)
		}
		return res, err
	}
}

// replayOnce sends the replayed initialize ir until an upstream answers it
// (see sendReplay) and returns the request it sent last, the upstream, the
// session ID it opened, and the protocol version it negotiated. An upstream session that opened but
// cannot be used is ended at once (endOrphan).
func (f *failover) replayOnce(r *http.Request, next caddyhttp.Handler, ir *http.Request, body []byte) (last *http.Request, to *session.Upstream, newID, version string, err error) {
	ans, ir, err := sendReplay(next, ir, body)
	if err != nil || !ans.ok() {
		return ir, nil, "", "", fmt.Errorf("%w: status %d, error %v", errNoFailover, ans.status, err)
	}
	newID, sel := ans.header.Get(HeaderSessionID), selectedUpstream(ir)
	if sel == nil || len(ans.header[HeaderSessionID]) != 1 || mcpwire.CheckSessionID(newID, f.maxIDLen) != "" {
		return ir, nil, "", "", fmt.Errorf("%w: the answer carried no usable Mcp-Session-Id", errNoFailover)
	}
	to = f.table.UseUpstream(sel.Dial)
	if version, err = ans.initializeResult(); err != nil {
		f.endOrphan(r, next, to, newID, "")
		return ir, nil, "", "", fmt.Errorf("%w: %s", errNoFailover, err)
	}
	return ir, to, newID, version, nil
}

// sessionVersion is the protocol version of a session whose requests carry
// MCP-Protocol-Version header value v: v, or 2025-03-26 without the header,
// as servers assume (MCP 2025-06-18 transports, §Protocol Version Header).
func sessionVersion(v string) string {
	if v == "" {
		return "2025-03-26"
	}
	return v
}

// sameVersion reports whether an upstream that negotiated version, asked
// for asked, serves a session whose requests carry MCP-Protocol-Version
// header value want: the same version; without the header, the version
// asked for, or 2025-03-26 or older.
func sameVersion(want, asked, version string) bool {
	if want == "" {
		return version == asked || mcpwire.Before(version, "2025-03-27")
	}
	return version == want
}

// atVersion returns the initialize request body with params.protocolVersion
// set to version, the session's, so that an upstream that supports it
// negotiates it again (MCP lifecycle, §Version Negotiation: the server
// answers the requested version when it supports it); body unchanged when
// version is "" or already asked for, or body cannot be rewritten.
func atVersion(body []byte, version string) []byte {
	if version == "" || requestedVersion(body) == version {
		return body
	}
	var msg map[string]json.RawMessage
	var params map[string]json.RawMessage
	if json.Unmarshal(body, &msg) != nil || json.Unmarshal(msg["params"], &params) != nil || params == nil {
		return body
	}
	params["protocolVersion"], _ = json.Marshal(version)
	msg["params"], _ = json.Marshal(params)
	out, err := json.Marshal(msg)
	if err != nil {
		return body
	}
	return out
}

// requestedVersion returns the params.protocolVersion of an initialize
// request body, "" when it has none.
func requestedVersion(body []byte) string {
	var msg struct {
		Params struct {
			ProtocolVersion string `json:"protocolVersion"`
		} `json:"params"`
	}
	_ = json.Unmarshal(body, &msg)
	return msg.Params.ProtocolVersion
}

// sendReplay sends the replayed initialize ir, of body body, until an
// upstream answers it. reverse_proxy sends it again after a failed dial
// (lb_retries); past that, the replay is sent again as long as the policy
// finds an upstream the replay has not tried (it avoids each one that
// failed it), so that every other upstream is tried once before the
// failover gives up, whatever lb_retries. Each attempt after the first
// gets its own request variables (see withOwnVars); it returns the answer
// and the request it sent last.
func sendReplay(next caddyhttp.Handler, ir *http.Request, body []byte) (*upstreamAnswer, *http.Request, error) {
	ex := exchangeOf(ir)
	for {
		ans, before := newUpstreamAnswer(), ex.selected
		err := next.ServeHTTP(ans, ir)
		if err == nil || ans.status != 0 || ex.selected == before || !unsent(err) {
			return ans, ir, err
		}
		ir = withOwnVars(ir)
		ir.Body, ir.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	}
}

// unsent reports whether err, returned by reverse_proxy, says that the
// request never reached the upstream: dialing it failed, or it closed the
// kept-alive connection before reading the request.
func unsent(err error) bool {
	var dialErr reverseproxy.DialError
	return errors.As(err, &dialErr) || closedUnread(err)
}

// endOrphan ends the session newID that a failover opened on upstream to
// and that no client uses, because another instance moved the session
// first: it sends DELETE, and ignores the answer (a server that does not
// support it forgets the session when its own timeout runs out).
func (f *failover) endOrphan(r *http.Request, next caddyhttp.Handler, to *session.Upstream, newID, version string) {
	dr := subrequest(r, nil)
	dr.Method, dr.Body, dr.ContentLength = http.MethodDelete, http.NoBody, 0
	dr.Header.Set(HeaderSessionID, newID)
	if version != "" {
		dr.Header.Set(HeaderProtocolVersion, version)
	}
	exchangeOf(dr).owner = to
	_ = next.ServeHTTP(newUpstreamAnswer(), dr)
}

// notifyInitialized sends notifications/initialized of session newID,
// negotiated at version, to upstream to.
func (f *failover) notifyInitialized(r *http.Request, next caddyhttp.Handler, to *session.Upstream, newID, version string) error {
	nr := subrequest(r, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`))
	nr.Header.Set("Accept", "application/json, text/event-stream")
	nr.Header.Set("Content-Type", "application/json")
	nr.Header.Set(HeaderSessionID, newID)
	if version != "" {
		nr.Header.Set(HeaderProtocolVersion, version)
	}
	exchangeOf(nr).owner = to
	ans := newUpstreamAnswer()
	if err := next.ServeHTTP(ans, nr); err != nil || !ans.ok() {
		return fmt.Errorf("%w: notifications/initialized got status %d, error %v", errNoFailover, ans.status, err)
	}
	return nil
}

// subrequest returns a POST with body, for the proxy's own exchange with an
// upstream on behalf of r: r's headers (its credentials among them) without
// its session and MCP request headers, asking for an uncompressed answer, and r's request variables without
// the policy's, with an empty exchange of its own: nothing decided for it
// yet, and no placeholders added to r's replacer.
func subrequest(r *http.Request, body []byte) *http.Request {
	vars, _ := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	own := maps.Clone(vars)
	if own == nil {
		own = map[string]any{}
	}
	own[varExchange] = subexchange(exchangeOf(r))
	sr := r.Clone(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, own))
	sr.Method = http.MethodPost
	sr.Body, sr.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	sr.GetBody = nil
	for _, k := range []string{HeaderSessionID, HeaderMethod, HeaderName, HeaderProtocolVersion, "Last-Event-Id", "Content-Length"} {
		sr.Header.Del(k)
	}
	sr.Header.Set("Accept-Encoding", identityEncoding)
	return sr
}

// subexchange returns the exchange of a request the proxy sends for the
// client's request of exchange ex: what ex's attempts learned of the
// upstreams (tried), and what the client's request is (init, failedOver,
// legacyPost), without the session's upstream, the policy's picks and
// marks, and the body.
func subexchange(ex *exchange) *exchange {
	return &exchange{own: true, tried: slices.Clone(ex.tried), init: ex.init, failedOver: ex.failedOver, legacyPost: ex.legacyPost}
}

// setInitHeaders sets the headers of the kept initialize on h.
func setInitHeaders(h http.Header, init *session.Init) {
	for k, v := range map[string]string{"Accept": init.Accept, "Content-Type": init.ContentType, HeaderProtocolVersion: init.Version} {
		if v == "" {
			h.Del(k)
		} else {
			h.Set(k, v)
		}
	}
}

// prepareRetry returns r ready to be sent to the session's new upstream,
// which knows it as upstreamID: its own request variables (see
// withOwnVars), without the handler's and policy's, the new ID, the kept
// body, and w's headers as before the attempt.
func (f *failover) prepareRetry(w http.ResponseWriter, r *http.Request, pf *pinnedFailover, upstreamID string) *http.Request {
	r = withOwnVars(r)
	clearSelection(r)
	exchangeOf(r).failedOver = true
	r.Header[HeaderSessionID] = []string{upstreamID}
	if pf.kept && r.Method == http.MethodPost {
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(pf.body)), int64(len(pf.body))
	}
	if pf.held {
		clear(w.Header())
		maps.Copy(w.Header(), pf.header)
	}
	return r
}

// serveFailover fails over the session of a pinned request that found its
// upstream from gone, and sends the request to the new upstream. When no
// upstream takes the session, the client gets the 404 it would get
// without failover, and the session ends.
func (h *Handler) serveFailover(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, id string, from *session.Upstream, pf *pinnedFailover, cause session.FailoverCause) error {
	if pf.held && !pf.kept {
		h.table.Evict(id, session.EvictUpstream404)
		return writeSessionNotFound(w, "Session not found")
	}
	to, retry, err := h.failover.failOver(w, r, next, id, from, pf, cause)
	if err != nil {
		return h.failover.serveFailoverFailed(w, r, id, pf, err)
	}
	err = h.servePinned(w, retry, next, id, to)
	decide(r, decisionFailedOver, to.Dial())
	return err
}

// serveFailoverFailed answers the request of a session no upstream took
// over, or that may not fail over (err is then a failoverRefusal), with the
// 404 the client would get without failover, and ends the session.
func (f *failover) serveFailoverFailed(w http.ResponseWriter, r *http.Request, id string, pf *pinnedFailover, err error) error {
	var refused session.Refusal // "" unless err is one
	_ = errors.As(err, &refused)
	if pf.held {
		clear(w.Header())
		maps.Copy(w.Header(), pf.header)
		f.table.Evict(id, session.EvictUpstream404)
		if refused != "" {
			return writeSessionNotFound(w, "Session not found: "+string(refused))
		}
		return writeSessionNotFound(w, "Session not found")
	}
	f.table.Stats.CountGone()
	decide(r, decisionGone, "")
	f.table.Evict(id, session.EvictUpstreamGone)
	if refused != "" {
		return writeSessionNotFound(w, "Session not found: its upstream is gone, and "+string(refused))
	}
	return writeSessionNotFound(w, "Session not found: its upstream is gone, and no other upstream took the session over")
}

// logFailover logs a failover at info level, its failure at warn level,
// and a refused one at debug level (a client with a leaked or ended ID
// controls how often).
func (f *failover) logFailover(id string, from *session.Upstream, res session.FailoverResult, cause session.FailoverCause, err error) {
	fields := []zap.Field{zap.String("session", fingerprint(id)), zap.String("from", from.Dial()), zap.Stringer("cause", cause)}
	var refused session.Refusal
	switch {
	case errors.As(err, &refused):
		f.debug("failover_refused", id, from.Dial(), zap.Stringer("cause", cause), zap.String("why", string(refused)))
	case err != nil:
		f.logger.Warn("failover failed; the session ends", append(fields, zap.Error(err))...)
	case res.Followed:
		f.logger.Info("failover: followed the move another instance recorded in the store", append(fields, zap.String("to", res.Up.Dial()))...)
	default:
		f.logger.Info("failover", append(fields, zap.String("to", res.Up.Dial()))...)
	}
}

// restoreSessionID gives the client back its own session ID in a response
// of a session that failed over: every Mcp-Session-Id equal to sent, the ID
// the upstream knows, becomes clientID.
func restoreSessionID(header http.Header, sent, clientID string) {
	for i, v := range header[HeaderSessionID] {
		if v == sent {
			header[HeaderSessionID][i] = clientID
		}
	}
}
