package redisstore

import (
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"hash"
	"sync"
)

// keyHash is the keyed hash of a session ID: the first 16 bytes of its
// HMAC-SHA256 under the store's hash_key.
type keyHash [16]byte

// String returns the hash as it appears in Redis: unpadded base64url.
func (h keyHash) String() string { return base64.RawURLEncoding.EncodeToString(h[:]) }

// parseKeyHash decodes a hash written by String.
func parseKeyHash(s string) (keyHash, bool) {
	var h keyHash
	n, err := base64.RawURLEncoding.Decode(h[:], []byte(s))
	return h, err == nil && n == len(h)
}

// keyspace names the keys of one table in Redis. A session's own keys
// share a hash tag of their own, its key hash {<hash>}, so that in a Redis
// Cluster the table's sessions spread over the slots (and the masters),
// while the keys a script changes together (a session's value, tombstone
// and reclaim record) share a slot. The table's few shared keys share the
// tag {<prefix>:<table>}: the upstreams' sets, the flags, the marker.
//
//	<p>:<t>:s:{<hash>}  string  the session's upstream (dial address), then, for a session
//	                            bound to a principal, a space and the principal's keyed hash
//	                            (hex), then, with failover reinitialize, a space, "~" and the
//	                            session's sealed failover record (record.go); with the
//	                            idle TTL
//	<p>:<t>:x:{<hash>}  string  the tombstone of a session that ended for good (DELETE, admin
//	                            eviction): the eviction reason, with the ID's remaining natural
//	                            life as TTL (session tombstones); no replica adopts or fails it over
//	<p>:<t>:r:{<hash>}  string  the session's sealed reclaim record, while its table reclaims (reclaim.go),
//	                            with the value's TTL and a minute more
//	<p>:<t>:j:{<hash>}:…        the session's event journal, with journal on (internal/journal)
//	{p:t}:j:b:<slice>   string  the journal's bytes appended in a slice of its window
//	{p:t}:u:<dial>      zset    the upstream's sessions: member <hash>, score the expiry (Unix ms);
//	                            in a Redis Cluster, split in upstreamBuckets sets {p:t:<k>.<n>}:u:<dial>
//	                            (buckets.go), so that they spread over the masters too
//	{p:t}:upstreams     zset    upstreams known to any instance: member <dial>, score last seen (Unix ms)
//	{p:t}:draining      hash    draining upstreams: field <dial>
//	{p:t}:hashkeys      zset    fingerprints of the hash_keys instances use: member <fingerprint>,
//	                            score last seen (Unix ms); more than one in use is a misconfiguration
//	{p:t}:alive         string  the table's marker: a random token, no TTL; gone or changed, it
//	                            tells the instances that Redis lost keys while running (lost.go)
//	{p:t}:events        channel what instances tell each other (see redisConn.apply)
//
// Before the sessions had tags of their own (layout 1, legacy.go), their
// keys were {p:t}:s:<hash> and {p:t}:x:<hash>, and the reclaim records
// fields of the hash {p:t}:r. This layout reads them while replicas of the
// older version may still write them: a session's own key first, else its
// layout-1 key; it writes only its own keys, and removes the layout-1 ones
// when the session ends.
type keyspace struct {
	tag         string // {<prefix>:<table>}: the tag of the table's shared keys
	base        string // <prefix>:<table>: how a session's own keys begin
	hmacs       sync.Pool
	principal   []byte      // the key of principal hashes, derived from hash_key
	records     cipher.AEAD // seals failover records, under a key derived from hash_key
	fingerprint string      // names hash_key without revealing it, derived from hash_key
	buckets     []string    // the tags of an upstream's sets: the table's alone, or a cluster's buckets (buckets.go)
}

func newKeyspace(prefix, table string, hashKey []byte) *keyspace {
	ks := &keyspace{tag: "{" + prefix + ":" + table + "}", base: prefix + ":" + table}
	ks.buckets = []string{ks.tag}
	ks.hmacs.New = func() any { return hmac.New(sha256.New, hashKey) }
	// HMAC as a key-derivation function (RFC 2104 keyed with the secret,
	// over a fixed label): session keys and principal hashes use separate
	// keys derived from the one secret.
	m := hmac.New(sha256.New, hashKey)
	m.Write([]byte("mcp_sessions principal key"))
	ks.principal = m.Sum(nil)
	m = hmac.New(sha256.New, hashKey)
	m.Write([]byte("mcp_sessions hash_key fingerprint"))
	ks.fingerprint = hex.EncodeToString(m.Sum(nil)[:8])
	ks.records = newRecordAEAD(hashKey)
	return ks
}

// hash returns the keyed hash of session id.
func (ks *keyspace) hash(id string) keyHash {
	m := ks.hmacs.Get().(hash.Hash)
	m.Reset()
	m.Write([]byte(id))
	var sum [sha256.Size]byte
	var h keyHash
	copy(h[:], m.Sum(sum[:0]))
	ks.hmacs.Put(m)
	return h
}

func (ks *keyspace) session(h keyHash) string       { return ks.sessionOf(h.String()) }
func (ks *keyspace) tomb(h keyHash) string          { return ks.tombOf(h.String()) }
func (ks *keyspace) record(h keyHash) string        { return ks.recordOf(h.String()) }
func (ks *keyspace) sessionOf(member string) string { return ks.base + ":s:{" + member + "}" }
func (ks *keyspace) tombOf(member string) string    { return ks.base + ":x:{" + member + "}" }
func (ks *keyspace) recordOf(member string) string  { return ks.base + ":r:{" + member + "}" }
func (ks *keyspace) journalOf(id string) string     { return ks.base + ":j:{" + ks.hash(id).String() + "}" }
func (ks *keyspace) upstreams() string              { return ks.tag + ":upstreams" }
func (ks *keyspace) draining() string               { return ks.tag + ":draining" }
func (ks *keyspace) events() string                 { return ks.tag + ":events" }
func (ks *keyspace) hashKeys() string               { return ks.tag + ":hashkeys" }
func (ks *keyspace) alive() string                  { return ks.tag + ":alive" }
