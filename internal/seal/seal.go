// Package seal is the one authenticated-encryption envelope of the plugin:
// sealed session IDs (session.go) and the failover records of the redis
// store are envelopes of this one format, under their own keys and
// versions.
//
// An envelope is
//
//	base64url-nopad( version || nonce (12 bytes) || ciphertext || tag (16 bytes) )
//
// where nonce, ciphertext and tag are AES-256-GCM's (NIST SP 800-38D), as
// produced by [cipher.NewGCMWithRandomNonce]: a random 96-bit nonce per
// seal. The additional authenticated data is the version byte followed by
// the caller's associated data (none for session IDs, the session's key
// hash for a failover record), so that a value never opens as another
// version, nor for another record, than it was sealed as. The encoding is
// base64url without padding (RFC 4648 §5), decoded strictly: every
// envelope has exactly one spelling, of visible ASCII only.
//
// The plaintext of a [Message] is
//
//	[ uvarint(stamp) ] || field(f1) || … || field(fn-1) || fn
//
// where field(x) is uvarint(len(x)) || x, uvarint is
// [binary.AppendUvarint]'s, and the stamp (a time, never 0) leads only the
// versions that carry one. The last field takes the rest of the plaintext.
// Each use documents which fields its versions carry, in this notation.
//
// Random nonces keep one key safe for 2^32 seals (NIST SP 800-38D §8.3).
// The package imports no Caddy package.
package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// KeySize is the size of a key in bytes (AES-256).
const KeySize = 32

// NonceSize and TagSize are AES-GCM's standard nonce and tag sizes (NIST SP
// 800-38D), in bytes.
const NonceSize, TagSize = 12, 16

// overhead is what an envelope adds to its plaintext before encoding, in
// bytes: the version, the nonce and the tag.
const overhead = 1 + NonceSize + TagSize

// encoding is base64url without padding (RFC 4648 §5). Strict decoding
// rejects non-zero padding bits, so every envelope has one spelling.
var encoding = base64.RawURLEncoding.Strict()

// Sealer seals envelopes under its first key and opens them under every
// key, which lets a new key be rolled in with no value lost. The zero
// Sealer has no key and must not be used. A Sealer is safe for concurrent
// use.
type Sealer struct {
	first cipher.AEAD   // seals and opens
	more  []cipher.AEAD // open too, tried in order after first
}

// New returns a sealer whose first key seals and whose every key opens.
// Each key must be [KeySize] bytes; it errors on a key of another length
// or on no keys.
func New(keys ...[]byte) (Sealer, error) {
	if len(keys) == 0 {
		return Sealer{}, errors.New("no sealing key")
	}
	var s Sealer
	for i, k := range keys {
		if len(k) != KeySize {
			return Sealer{}, fmt.Errorf("key %d is %d bytes; it must be %d", i+1, len(k), KeySize)
		}
		block, err := aes.NewCipher(k)
		if err != nil {
			return Sealer{}, err
		}
		aead, err := cipher.NewGCMWithRandomNonce(block)
		if err != nil {
			return Sealer{}, err
		}
		if i == 0 {
			s.first = aead
		} else {
			s.more = append(s.more, aead)
		}
	}
	return s, nil
}

// Under returns a sealer of the one AEAD aead, which must be AES-256-GCM
// with random nonces ([cipher.NewGCMWithRandomNonce]): for a key the caller
// derives itself. It does not allocate.
func Under(aead cipher.AEAD) Sealer { return Sealer{first: aead} }

// Message is the plaintext of an envelope, before encoding (see the
// package doc).
type Message struct {
	// Stamp leads the plaintext as a uvarint when it is not 0.
	Stamp uint64
	// Fields follow, each but the last prefixed by its length; at least one.
	Fields []string
}

// plainLength returns the length of m's plaintext, in bytes.
func (m *Message) plainLength() int {
	n := len(m.Fields[len(m.Fields)-1])
	if m.Stamp != 0 {
		n += uvarintLen(m.Stamp)
	}
	for _, f := range m.Fields[:len(m.Fields)-1] {
		n += uvarintLen(uint64(len(f))) + len(f)
	}
	return n
}

// Length returns the length of the envelope of m, encoded, in bytes.
func Length(m Message) int { return encoding.EncodedLen(overhead + m.plainLength()) }

// Seal returns the envelope of m under the first key, of the given
// version, authenticating version || ad. Each call draws a fresh nonce. It
// makes one buffer for the associated data, the plaintext, the sealed
// bytes and their encoding, and one string.
func (s Sealer) Seal(version byte, ad []byte, m Message) string {
	adLen, plainLen := 1+len(ad), m.plainLength()
	sealedLen := overhead + plainLen
	out := make([]byte, adLen+plainLen+sealedLen+encoding.EncodedLen(sealedLen))
	fullAD := append(append(out[:0], version), ad...)
	plain := out[adLen:adLen]
	if m.Stamp != 0 {
		plain = binary.AppendUvarint(plain, m.Stamp)
	}
	for _, f := range m.Fields[:len(m.Fields)-1] {
		plain = append(binary.AppendUvarint(plain, uint64(len(f))), f...)
	}
	plain = append(plain, m.Fields[len(m.Fields)-1]...)
	at := adLen + plainLen
	sealed := append(out[at:at], version)
	sealed = s.first.Seal(sealed, nil, plain, fullAD)
	enc := out[at+sealedLen:]
	encoding.Encode(enc, sealed)
	return string(enc)
}

// Open opens the envelope v, sealed with associated data ad under one of
// the keys, if its version is one accept takes. It returns v decoded (its
// version first) and the plaintext, two strings sharing one allocation;
// false for a value that is not canonical base64url, of another version,
// sealed under no key of s or with other associated data, or modified.
func (s Sealer) Open(v string, ad []byte, accept func(version byte) bool) (raw, plain string, ok bool) {
	n := encoding.DecodedLen(len(v))
	if n < overhead {
		return "", "", false
	}
	// One buffer: the associated data, the encoded value, the decoded
	// value, the plaintext.
	adLen := 1 + len(ad)
	buf := make([]byte, adLen+len(v)+n+n-overhead)
	fullAD, enc, dec := buf[:adLen], buf[adLen:adLen+len(v)], buf[adLen+len(v):adLen+len(v)+n]
	copy(enc, v)
	if m, err := encoding.Decode(dec, enc); err != nil || m != n || !accept(dec[0]) {
		return "", "", false
	}
	fullAD[0] = dec[0]
	copy(fullAD[1:], ad)
	at := adLen + len(v) + n
	for i := -1; i < len(s.more); i++ {
		aead := s.first
		if i >= 0 {
			aead = s.more[i]
		}
		if p, err := aead.Open(buf[at:at], nil, dec[1:], fullAD); err == nil {
			all := string(buf[adLen+len(v) : at+len(p)])
			return all[:n], all[n:], true
		}
	}
	return "", "", false
}

// Split splits a plaintext into its stamp, when stamped, and len(fields)
// fields, filling fields; it reports false for a plaintext that a Message
// of that shape does not make: a stamp cut short, 0 or past the range of
// an int64, or a length prefix cut short or past the end. The fields share
// plain's memory.
func Split(plain string, stamped bool, fields []string) (stamp uint64, ok bool) {
	if stamped {
		k := 0
		if stamp, k = uvarint(plain); k <= 0 || stamp == 0 || stamp > math.MaxInt64 {
			return 0, false
		}
		plain = plain[k:]
	}
	last := len(fields) - 1
	for i := range last {
		if fields[i], plain, ok = cutField(plain); !ok {
			return 0, false
		}
	}
	fields[last] = plain
	return stamp, true
}

// cutField splits a uvarint-length-prefixed field off the front of s.
func cutField(s string) (field, rest string, ok bool) {
	l, k := uvarint(s)
	if k <= 0 || l > uint64(len(s)-k) {
		return "", "", false
	}
	return s[k : k+int(l)], s[k+int(l):], true
}

// uvarint decodes a uvarint at the front of s, as [binary.Uvarint] does.
func uvarint(s string) (uint64, int) {
	var b [binary.MaxVarintLen64]byte
	return binary.Uvarint(b[:copy(b[:], s)])
}

// uvarintLen returns the length of n as a uvarint, in bytes.
func uvarintLen(n uint64) int {
	var b [binary.MaxVarintLen64]byte
	return len(binary.AppendUvarint(b[:0], n))
}

// Decode returns the bytes of v if it is canonical base64url without
// padding, as every envelope is, without opening it.
func Decode(v string) (string, bool) {
	raw, err := encoding.DecodeString(v)
	if err != nil {
		return "", false
	}
	return string(raw), true
}

// Encode returns raw, the bytes of an envelope, in its encoding: the
// inverse of [Decode].
func Encode(raw string) string { return encoding.EncodeToString([]byte(raw)) }
