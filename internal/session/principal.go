package session

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"hash"
	"sync"
)

// DefaultBindPrincipal is the principal a session is bound to unless
// configured otherwise: the user ID that Caddy's authentication handler
// (`basic_auth`, or any `http.authentication` provider) sets. It does not
// change when a client refreshes its OAuth token, which changes the
// `Authorization` header mid-session, and it is empty (the session is
// unbound) when Caddy does not authenticate the request.
const DefaultBindPrincipal = "{http.auth.user.id}"

// BindPrincipalOff turns principal binding off.
const BindPrincipalOff = "off"

// principalSum is a keyed hash of a principal, as a session stores it: the
// first 16 bytes of HMAC-SHA256 (RFC 2104) under the table's key, truncated
// as RFC 2104 §5 allows. Nobody without the key can compute it, so a
// client who wants to pass for another principal can only guess, one
// request per guess. (Any sum moves a session's golang-lru list element
// from Go's 96-byte to its 112-byte size class; 8 bytes would cost as much.)
// The zero value means "no principal": the session is unbound.
type PrincipalSum [16]byte

// principalKeys hashes principals under one key. Without a shared store,
// the key is random, made when the table is created: sums are only ever
// compared within the process that made them, and cannot be computed by
// anyone without it. With the redis store, every Caddy instance must
// compare the sums the others stored: the key is derived from the store's
// secret hash_key.
type principalKeys struct {
	macs sync.Pool // of hash.Hash keyed with the table's key
}

// newPrincipalKeys returns a hasher under key, or under a fresh random
// 256-bit key when key is nil.
func newPrincipalKeys(key []byte) *principalKeys {
	if key == nil {
		key = make([]byte, sha256.Size)
		_, _ = rand.Read(key) // never fails (crypto/rand, Go 1.24+)
	}
	return &principalKeys{macs: sync.Pool{New: func() any { return hmac.New(sha256.New, key) }}}
}

// sum returns the keyed hash of principal; the zero sum for "".
func (k *principalKeys) sum(principal string) PrincipalSum {
	var s PrincipalSum
	if principal == "" {
		return s
	}
	mac := k.macs.Get().(hash.Hash)
	mac.Reset()
	mac.Write([]byte(principal))
	var full [sha256.Size]byte
	copy(s[:], mac.Sum(full[:0]))
	k.macs.Put(mac)
	if s == (PrincipalSum{}) {
		s[0] = 1 // keep the zero sum for "unbound" (probability 2^-128)
	}
	return s
}
