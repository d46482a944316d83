package seal

import "time"

// The versions of sealed session IDs: the first byte of every sealed
// session ID. A new format takes a new version. The proxy seals versions 3
// and 4; it still opens values of versions 1 and 2, minted before sealed
// IDs carried their issue time.
//
// The fields of each version, as a [Message] (package doc):
//
//	1: dial, bound, ID
//	2: dial, bound, ID, Accept, Content-Type, MCP-Protocol-Version, initialize body
//	3: stamp issued; then those of version 1
//	4: stamp issued; then those of version 2
//
// issued is the time the value was sealed, in seconds since the Unix epoch
// (never 0); dial the upstream's dial address; bound "" for a session not
// bound to a principal, and otherwise 16 bytes (the first 16 of the
// SHA-256 of the principal that opened the session); ID the upstream's own
// session ID; the headers are the initialize request's, and its body is
// never empty. A version 3 ID is therefore 36 bytes (52 when bound) plus
// the dial address and the upstream's ID before encoding (the issue time
// takes 5 bytes until the year 3058), and 4/3 of that after: 102
// characters for a 26-byte go-sdk ID on `127.0.0.1:9001`, 115 for a
// 36-byte UUID (123 and 136 when bound). Version 4 adds the initialize
// request, its headers and 4 bytes of lengths: 428 characters for the
// go-sdk client's 190-byte initialize with a 26-byte ID on
// `127.0.0.1:9001`.
const (
	// VersionPlain: the upstream's dial address, a principal's digest and
	// the upstream's session ID.
	VersionPlain byte = 1
	// VersionInit: those, and the session's initialize request.
	VersionInit byte = 2
	// VersionIssued: the time the value was issued, then what version 1
	// carries.
	VersionIssued byte = 3
	// VersionIssuedInit: the time the value was issued, then what version
	// 2 carries.
	VersionIssuedInit byte = 4
)

// BoundSize is the size of a session's principal digest, in bytes.
const BoundSize = 16

// IsSessionVersion reports whether b is a version of sealed session IDs.
func IsSessionVersion(b byte) bool { return b >= VersionPlain && b <= VersionIssuedInit }

// Session is what a sealed session ID carries.
type Session struct {
	// Issued is when the value was sealed, in seconds since the Unix
	// epoch; 0 in versions 1 and 2, which do not carry it. SealSession
	// fills in the current time when it is 0.
	Issued int64
	Dial   string // the upstream's dial address; never empty
	Bound  string // the session's principal digest, BoundSize bytes; "" if unbound
	ID     string // the upstream's own session ID; never empty
	Init   Init   // the session's initialize request; empty in versions 1 and 3
}

// Init is what a sealed session ID carries of the session's initialize
// request. An empty Body means none.
type Init struct {
	Accept, ContentType, Version, Body string
}

// message returns the Message that carries ss, in buf, and its version.
func (ss *Session) message(buf *[7]string) (Message, byte) {
	issued := uint64(ss.Issued)
	if ss.Issued <= 0 {
		issued = uint64(time.Now().Unix())
	}
	buf[0], buf[1], buf[2] = ss.Dial, ss.Bound, ss.ID
	if ss.Init.Body == "" {
		return Message{Stamp: issued, Fields: buf[:3]}, VersionIssued
	}
	buf[3], buf[4], buf[5], buf[6] = ss.Init.Accept, ss.Init.ContentType, ss.Init.Version, ss.Init.Body
	return Message{Stamp: issued, Fields: buf[:7]}, VersionIssuedInit
}

// SealSession returns the sealed session ID of ss under the first key: of
// version 4 if it carries an initialize, else 3.
func (s Sealer) SealSession(ss Session) string {
	var buf [7]string
	m, version := ss.message(&buf)
	return s.Seal(version, nil, m)
}

// SessionLength returns the length of the sealed session ID of ss, in
// bytes.
func SessionLength(ss Session) int {
	var buf [7]string
	m, _ := ss.message(&buf)
	return Length(m)
}

// OpenSession returns what the sealed session ID v carries, and v
// decoded, which begins with the version byte; false for a value that is
// not a sealed session ID of a known version under one of the keys, is
// modified, or carries an empty dial address or ID, a principal digest of
// another size, or, in versions 2 and 4, an empty initialize body. The
// strings share one allocation.
func (s Sealer) OpenSession(v string) (raw string, ss Session, ok bool) {
	if encoding.DecodedLen(len(v)) < overhead+4 { // two 1-byte lengths, dial and ID
		return "", ss, false
	}
	raw, plain, ok := s.Open(v, nil, IsSessionVersion)
	if !ok {
		return "", ss, false
	}
	ss, ok = splitSession(plain, raw[0])
	return raw, ss, ok
}

// splitSession splits the plaintext of a sealed session ID of the given
// version into what it carries.
func splitSession(plain string, version byte) (ss Session, ok bool) {
	withInit := version == VersionInit || version == VersionIssuedInit
	var f [7]string
	fields := f[:3]
	if withInit {
		fields = f[:7]
	}
	issued, ok := Split(plain, version >= VersionIssued, fields)
	if !ok || f[0] == "" || f[2] == "" || f[1] != "" && len(f[1]) != BoundSize || withInit && f[6] == "" {
		return ss, false
	}
	return Session{Issued: int64(issued), Dial: f[0], Bound: f[1], ID: f[2],
		Init: Init{Accept: f[3], ContentType: f[4], Version: f[5], Body: f[6]}}, true
}
