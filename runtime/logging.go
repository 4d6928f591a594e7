package runtime

import (
	"context"
	"errors"
	"io"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ProtoactorLogger wraps l for protoactor's own logs (pass it to
// actor.WithLoggerFactory when you create the actor system yourself;
// nodes that create their system do this already). protoactor logs its
// lifecycle (endpoints started, connected, closing) at INFO and a peer's
// normal shutdown as ERROR ("EndpointWriter lost connection"); through
// this wrapper lifecycle lines are DEBUG, a connection lost because the
// peer went away (gRPC Unavailable or Canceled, EOF) is DEBUG, other lost
// connections are WARN, and every other record is unchanged. A peer being
// down is visible in Node.Peers and the admin endpoint, where it belongs.
func ProtoactorLogger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(quietHandler{l.Handler()})
}

// shutdownNoise are protoactor ERROR records that a normal peer or node
// shutdown produces.
var shutdownNoise = map[string]bool{
	"EndpointReader failed to send disconnection message": true,
	"EndpointWriter error when closing the stream":        true,
	"EndpointWriter error when closing the client conn":   true,
}

const lostConnection = "EndpointWriter lost connection"

type quietHandler struct{ h slog.Handler }

func (q quietHandler) Enabled(ctx context.Context, l slog.Level) bool { return q.h.Enabled(ctx, l) }

func (q quietHandler) Handle(ctx context.Context, r slog.Record) error {
	level := r.Level
	switch {
	case level == slog.LevelInfo:
		level = slog.LevelDebug
	case level == slog.LevelError && shutdownNoise[r.Message]:
		level = slog.LevelDebug
	case level == slog.LevelError && r.Message == lostConnection:
		level = slog.LevelWarn
		r.Attrs(func(a slog.Attr) bool {
			if err, ok := a.Value.Any().(error); ok && a.Key == "error" && peerWentAway(err) {
				level = slog.LevelDebug
				return false
			}
			return true
		})
	}
	if level != r.Level {
		if !q.h.Enabled(ctx, level) {
			return nil
		}
		r.Level = level
	}
	return q.h.Handle(ctx, r)
}

func (q quietHandler) WithAttrs(as []slog.Attr) slog.Handler { return quietHandler{q.h.WithAttrs(as)} }
func (q quietHandler) WithGroup(name string) slog.Handler    { return quietHandler{q.h.WithGroup(name)} }

// peerWentAway reports whether a stream error means the other side closed
// or the connection was cancelled: what a normal shutdown looks like.
func peerWentAway(err error) bool {
	if errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) {
		return true
	}
	if s, ok := status.FromError(err); ok {
		return s.Code() == codes.Unavailable || s.Code() == codes.Canceled
	}
	return false
}
