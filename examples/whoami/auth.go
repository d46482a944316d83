package whoami

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
)

// ResourceMetadataPrefix is the path under which a protected resource
// serves its metadata: the well-known URI of RFC 9728 §3.1, followed by
// the resource's path.
const ResourceMetadataPrefix = "/.well-known/oauth-protected-resource"

// ProtectedByHost requires `Authorization: Bearer <token>` on every request
// to next, with go-sdk's auth.RequireBearerToken. A request without it gets
// 401 with `WWW-Authenticate: Bearer resource_metadata="<URL>"` (RFC 9728
// §5.1), where the URL is absolute and built from the request's Host, as
// servers that are not told their public URL build it. Behind a proxy that
// rewrites Host, it names the proxy's upstream address instead of the
// public name.
func ProtectedByHost(token string, next http.Handler) http.Handler {
	verify := func(_ context.Context, got string, _ *http.Request) (*auth.TokenInfo, error) {
		if got != token {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{Expiration: time.Now().Add(time.Hour)}, nil
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		opts := &auth.RequireBearerTokenOptions{ResourceMetadataURL: urlFromHost(r, ResourceMetadataPrefix+r.URL.Path)}
		auth.RequireBearerToken(verify, opts)(next).ServeHTTP(w, r)
	})
}

// ResourceMetadataHandler serves the protected-resource metadata (RFC 9728
// §3) of the resource whose path follows ResourceMetadataPrefix, with
// go-sdk's auth.ProtectedResourceMetadataHandler; its `resource` is built
// from the request's Host.
func ResourceMetadataHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resource := urlFromHost(r, strings.TrimPrefix(r.URL.Path, ResourceMetadataPrefix))
		meta := &oauthex.ProtectedResourceMetadata{Resource: resource, BearerMethodsSupported: []string{"header"}}
		auth.ProtectedResourceMetadataHandler(meta).ServeHTTP(w, r)
	})
}

// urlFromHost returns the absolute URL of path on the host the request names.
func urlFromHost(r *http.Request, path string) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host + path
}
