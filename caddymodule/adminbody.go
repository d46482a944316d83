package caddymodule

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The admin API's input is read so that it means one thing: a body or a
// query that a lenient reader could take in two ways (a key given twice,
// of which encoding/json keeps the last; a second JSON value after the
// first, which json.Decoder leaves unread; a parameter given twice, of
// which url.Values.Get keeps the first) is refused with 400, and nothing
// is done. So a call never acts on part of what it was given.

// maxAdminBody is the largest body an admin call may send, in bytes.
const maxAdminBody = 1 << 16

// maxAdminDepth is how deeply the values of an admin body may nest.
const maxAdminDepth = 16

// decodeStrict decodes the JSON body data into v, a pointer to a struct
// whose fields all have a `json` tag. It refuses, naming what to send
// instead: anything but one JSON object followed by whitespace only; a key
// given twice in any object of it, also when the two differ only in case
// (encoding/json matches keys case-insensitively, with Unicode folding, and
// keeps the last); a null anywhere (which encoding/json reads as the field
// left out); a top-level key other than exactly one of v's tags; and a
// value of the wrong type. The errors are 400 caddy.APIErrors; example is
// a well-formed body, for the messages.
func decodeStrict(data []byte, v any, example string) error {
	fields := jsonFields(v)
	bad := func(format string, args ...any) error {
		return apiError(http.StatusBadRequest, "decoding the JSON body: "+format+"; send one JSON object such as %s (fields: %s)",
			append(args, example, strings.Join(fields, ", "))...)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if len(bytes.TrimLeft(data, jsonSpace)) == 0 {
		return bad("the body is empty")
	}
	if first := bytes.TrimLeft(data, jsonSpace)[0]; first != '{' {
		return bad("the body is not an object (it starts with %q)", first)
	}
	if err := walkJSON(dec, 0, true, fields); err != nil {
		return bad("%v", err)
	}
	if rest := bytes.TrimLeft(data[dec.InputOffset():], jsonSpace); len(rest) > 0 {
		return bad("more follows the object at byte %d (%q): a second value, or text after the object, is not read", len(data)-len(rest), clip(rest))
	}
	strict := json.NewDecoder(bytes.NewReader(data))
	strict.DisallowUnknownFields()
	if err := strict.Decode(v); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return bad("field %q is a JSON %s: give it as a JSON %s", typeErr.Field, typeErr.Value, jsonKind(typeErr.Type))
		}
		return bad("%v", err)
	}
	return nil
}

// jsonKind names the JSON type that decodes into t.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Slice, reflect.Array:
		return "array"
	case reflect.Map, reflect.Struct:
		return "object"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	}
	return "number"
}

// jsonSpace is the whitespace JSON allows between tokens (RFC 8259 §2).
const jsonSpace = " \t\r\n"

// walkJSON reads one JSON value from dec and checks it: no key twice in
// an object (up to case), no null, at most maxAdminDepth levels, and, with
// top, an object whose keys are exactly among fields.
func walkJSON(dec *json.Decoder, depth int, top bool, fields []string) error {
	if depth > maxAdminDepth {
		return fmt.Errorf("values nest deeper than %d levels", maxAdminDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return syntaxError(err)
	}
	switch tok {
	case nil:
		return errors.New("null is not a value here: give the field a value, or leave it out")
	case json.Delim('['):
		for dec.More() {
			if err := walkJSON(dec, depth+1, false, nil); err != nil {
				return err
			}
		}
	case json.Delim('{'):
		seen := map[string]string{} // folded key -> the key as given
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return syntaxError(err)
			}
			key := tok.(string) // json.Decoder returns object keys as strings
			if prev, dup := seen[foldKey(key)]; dup {
				if prev == key {
					return fmt.Errorf("key %q is given twice: give each field once", clip([]byte(key)))
				}
				return fmt.Errorf("keys %q and %q are the same field to a case-insensitive decoder: give each field once, spelled exactly", clip([]byte(prev)), clip([]byte(key)))
			}
			seen[foldKey(key)] = key
			if top && !slices.Contains(fields, key) {
				return fmt.Errorf("unknown field %q: the fields are spelled exactly as listed", clip([]byte(key)))
			}
			if err := walkJSON(dec, depth+1, false, nil); err != nil {
				return fmt.Errorf("field %q: %w", clip([]byte(key)), err)
			}
		}
	default:
		return nil // a string, number or boolean
	}
	if _, err := dec.Token(); err != nil { // the closing delimiter
		return syntaxError(err)
	}
	return nil
}

// syntaxError words a decoder's error for a body that is not JSON.
func syntaxError(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("the body ends before its JSON value does")
	}
	return err
}

// foldKey returns key with every rune replaced by the smallest rune of its
// Unicode simple case folding orbit, so that two keys encoding/json could
// match to the same field (it compares as bytes.EqualFold, Unicode simple
// folding: `K` U+212A folds with `k`, `ſ` U+017F with `s`) have the same
// fold key.
func foldKey(key string) string {
	var b strings.Builder
	for _, r := range key {
		min := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			if f < min {
				min = f
			}
		}
		b.WriteRune(min)
	}
	return b.String()
}

// jsonFields returns the json tag names of the struct v points to.
func jsonFields(v any) []string {
	t := reflect.TypeOf(v).Elem()
	var names []string
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); name != "" && name != "-" {
			names = append(names, name)
		}
	}
	return names
}

// clip returns at most the first 32 bytes of b, cut at a rune boundary,
// for an error message: what a client sent is quoted, but not at length.
func clip(b []byte) string {
	const max = 32
	if len(b) <= max {
		return string(b)
	}
	n := max
	for n > 0 && !utf8.RuneStart(b[n]) {
		n--
	}
	return string(b[:n]) + "…"
}

// readAdminBody reads the body of an admin call, at most maxAdminBody bytes.
func readAdminBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxAdminBody))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return nil, apiError(http.StatusBadRequest, "decoding the JSON body: it is larger than %d bytes: send one small JSON object", maxAdminBody)
	}
	if err != nil {
		return nil, apiError(http.StatusBadRequest, "decoding the JSON body: reading it failed (%v): send it again", err)
	}
	return data, nil
}

// strictQuery parses the query of an admin call, refusing one that does
// not parse, a parameter given twice and a parameter not among params
// (none: the endpoint takes no query). It returns each parameter's value.
func strictQuery(r *http.Request, params ...string) (map[string]string, error) {
	endpoint := r.Method + " " + r.URL.Path
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, apiError(http.StatusBadRequest, "%s: the query does not parse (%v): give name=value pairs joined by &, with %% and & in values escaped", endpoint, err)
	}
	takes := "takes no query parameters"
	if len(params) > 0 {
		takes = "takes the query parameters " + strings.Join(params, " and ")
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for name := range q {
			if !yield(name) {
				return
			}
		}
	})
	out := map[string]string{}
	for _, name := range names {
		switch {
		case !slices.Contains(params, name):
			hint := ""
			if name == "session_id" {
				hint = "; session IDs go in the JSON body of POST /mcp_sessions/lookup, never in a URL"
			}
			switch {
			case hint != "":
			case r.Method == http.MethodPost:
				hint = "; give the fields in the JSON body"
			default:
				hint = "; send only those, each once, spelled exactly"
			}
			return nil, apiError(http.StatusBadRequest, "%s %s, not %q%s", endpoint, takes, clip([]byte(name)), hint)
		case len(q[name]) > 1:
			return nil, apiError(http.StatusBadRequest, "%s: query parameter %s is given %d times: give it once", endpoint, name, len(q[name]))
		}
		out[name] = q[name][0]
	}
	return out, nil
}

// noBody refuses a GET admin call that sends a body: the endpoint would
// not read it, and so would act on part of what it was given.
func noBody(r *http.Request) error {
	if r.ContentLength != 0 {
		return apiError(http.StatusBadRequest, "%s %s takes no body: give its parameters in the query", r.Method, r.URL.Path)
	}
	return nil
}
