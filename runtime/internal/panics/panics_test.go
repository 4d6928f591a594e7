package panics

import (
	"errors"
	"testing"
)

func TestCallTurnsPanicsIntoErrors(t *testing.T) {
	if err := Call(func() {}); err != nil {
		t.Fatalf("no panic: %v", err)
	}
	sentinel := errors.New("port taken")
	if err := Call(func() { panic(sentinel) }); !errors.Is(err, sentinel) {
		t.Fatalf("error panic: %v", err)
	}
	if err := Call(func() { panic("boom") }); err == nil || err.Error() != "boom" {
		t.Fatalf("string panic: %v", err)
	}
}
