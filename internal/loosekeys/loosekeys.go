// Package loosekeys respells the object keys of JSON text in the ways a
// decoder that matches keys as Go's encoding/json does reads as the same
// key: another letter case, a character of the key's Unicode case-fold
// class (ſ U+017F for s, K U+212A KELVIN SIGN for k), \u escapes; and in
// ways no decoder reads as the key (characters that look alike but do not
// fold, bytes that are not UTF-8). The fuzz tests of the mcp matcher build
// their bodies with it (internal/mcpwire FuzzLooseKeys, tests
// FuzzLooseKeysSDKDecoders).
package loosekeys

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// Respell returns body with each object key respelled, character by
// character (as encoding/json decodes it), by the next byte of spell,
// cycling through it (see Char); string values, numbers and white space
// are copied unchanged. With an empty spell the result is body; text that
// is not JSON is respelled as far as it scans as JSON.
func Respell(body, spell []byte) []byte {
	if len(spell) == 0 {
		return body
	}
	var out strings.Builder
	n := 0
	for i := 0; i < len(body); {
		if body[i] != '"' {
			out.WriteByte(body[i])
			i++
			continue
		}
		end := stringEnd(body, i)
		raw := body[i:end]
		i = end
		var key string
		if !isKey(body, end) || json.Unmarshal(raw, &key) != nil {
			out.Write(raw)
			continue
		}
		out.WriteByte('"')
		for _, r := range key {
			out.WriteString(Char(r, spell[n%len(spell)]))
			n++
		}
		out.WriteByte('"')
	}
	return []byte(out.String())
}

// Char returns the JSON string text of one character of a key, spelled by
// choice: its low 4 bits pick a member of r's case-fold class (0 is r
// itself, then the classes' other members in unicode.SimpleFold's order);
// bits 4-5 write it raw (0), \u-escaped in lower-case hex (1) or in upper
// case (2), or (3) as a character that does not fold to it (r followed by
// U+0301 COMBINING ACUTE ACCENT, or r's fullwidth form); choice 0xff
// writes the byte 0xff, which is not UTF-8.
func Char(r rune, choice byte) string {
	if choice == 0xff {
		return "\xff"
	}
	orbit := []rune{r}
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		orbit = append(orbit, f)
	}
	c := orbit[int(choice&0x0f)%len(orbit)]
	switch choice >> 4 & 3 {
	case 1:
		return escape(c, "\\u%04x")
	case 2:
		return escape(c, "\\u%04X")
	case 3:
		if '!' <= c && c <= '~' {
			return escape(c+0xfee0, "\\u%04x") // the fullwidth form
		}
		return raw(c) + "\u0301"
	}
	return raw(c)
}

// raw writes c as JSON string text, escaping it only where JSON must.
func raw(c rune) string {
	if c == '"' || c == '\\' || c < 0x20 || !utf8.ValidRune(c) {
		return escape(c, "\\u%04x")
	}
	return string(c)
}

// escape writes c as \u escapes in format, a surrogate pair beyond the BMP.
func escape(c rune, format string) string {
	if c > 0xffff {
		hi, lo := utf16.EncodeRune(c)
		return fmt.Sprintf(format, hi) + fmt.Sprintf(format, lo)
	}
	return fmt.Sprintf(format, c)
}

// stringEnd returns the index after the string that starts at body[i].
func stringEnd(body []byte, i int) int {
	for i++; i < len(body); i++ {
		switch body[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(body)
}

// isKey reports whether the string ending before body[end] is an object
// key: the next byte that is not white space is ':'.
func isKey(body []byte, end int) bool {
	for ; end < len(body); end++ {
		switch body[end] {
		case ' ', '\t', '\r', '\n':
		case ':':
			return true
		default:
			return false
		}
	}
	return false
}
