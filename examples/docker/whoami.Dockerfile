# The repository's whoami MCP server (examples/whoami-server): a go-sdk
# server with in-memory sessions whose whoami tool names the server that
# answered. Build from the root of a checkout:
#
#   docker build -f examples/docker/whoami.Dockerfile -t whoami-server:dev .
#
# GO_VERSION is the go directive of this repository's go.mod.
ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
RUN CGO_ENABLED=0 go build -o /whoami-server ./examples/whoami-server

FROM gcr.io/distroless/static-debian12
COPY --from=build /whoami-server /whoami-server
ENTRYPOINT ["/whoami-server"]
CMD ["-listen", "0.0.0.0:9000"]
