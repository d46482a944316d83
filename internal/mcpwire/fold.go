package mcpwire

import (
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// Keys that a lenient JSON decoder reads as another.
//
// Go's encoding/json, which mcp-go and most Go servers decode requests
// with, gives an object member to the struct field of the key's name or,
// failing that, to a field whose name equals the key, once unescaped, under
// Unicode simple case folding (bytes.EqualFold): "Method", "paramſ" (ſ is
// U+017F LATIN SMALL LETTER LONG S, which folds to s) and "param\u017f" all
// reach the field params. The MCP Go SDK matches names exactly. The plugin
// reads a field only under its exact name and refuses a body holding a key
// that folds to the name of a field it reads without being that name, so
// that every server reads the fields the plugin read, or fails the request.

// foldsTo reports whether key, an unescaped JSON object key, differs from
// name but equals it under Unicode simple case folding, as bytes.EqualFold
// compares them: a decoder that matches keys as encoding/json does reads
// key as name. name must be ASCII. A key as long as name is compared in
// ASCII alone: the characters outside ASCII that fold to an ASCII letter
// (ſ U+017F to s, K U+212A KELVIN SIGN to k) take more bytes than it. It
// does not allocate.
func foldsTo(key []byte, name string) bool {
	switch {
	case len(key) < len(name) || len(key) > utf8.UTFMax*len(name) || len(name) == 0:
		return false
	case key[0] < utf8.RuneSelf && lowerASCII(key[0]) != lowerASCII(name[0]):
		return false // most keys: the first byte differs
	case len(key) == len(name):
		return string(key) != name && asciiFold(key, name)
	}
	return unicodeFold(key, name)
}

// asciiFold reports whether key and name, of the same length, are equal
// but for the letter case of ASCII letters.
func asciiFold(key []byte, name string) bool {
	for i := range len(key) {
		if lowerASCII(key[i]) != lowerASCII(name[i]) {
			return false
		}
	}
	return true
}

// unicodeFold reports whether key's characters equal name's bytes one for
// one under Unicode simple case folding. ASCII bytes are compared in
// place, so that an ASCII key, which cannot fold to a name of another
// length, is turned down at its first differing byte. A byte that is not
// UTF-8 is utf8.RuneError, which folds to no ASCII character.
func unicodeFold(key []byte, name string) bool {
	j := 0
	for i := 0; i < len(key); j++ {
		if j == len(name) {
			return false
		}
		if c := key[i]; c < utf8.RuneSelf {
			if lowerASCII(c) != lowerASCII(name[j]) {
				return false
			}
			i++
			continue
		}
		r, n := utf8.DecodeRune(key[i:])
		if !inFoldOrbit(r, rune(name[j])) {
			return false
		}
		i += n
	}
	return j == len(name)
}

// inFoldOrbit reports whether r is one of the characters that Unicode simple
// case folding makes equal to c (unicode.SimpleFold's orbit of c).
func inFoldOrbit(r, c rune) bool {
	for f := unicode.SimpleFold(c); f != c; f = unicode.SimpleFold(f) {
		if f == r {
			return true
		}
	}
	return false
}

// lowerASCII returns c in lower case if it is an ASCII letter.
func lowerASCII(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// looseKeyError is the error of a key of object what that folds to name:
// it names the key with every character outside ASCII escaped, so that the
// client sees which one it is.
func looseKeyError(what string, key []byte, name string) error {
	return fmt.Errorf("key %s of %s is ambiguous: servers that match keys as Go's encoding/json does "+
		"(ignoring letter case, with Unicode case folding) read it as %q; spell it %q",
		strconv.QuoteToASCII(string(key)), what, name, name)
}
