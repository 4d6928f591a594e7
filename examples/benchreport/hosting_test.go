package main

import (
	"os"
	"strconv"
	"testing"
)

// TestHostingReport runs the hosting section small (it fails on any send
// or commit error, a message not committed, or anything left pending).
// HOSTING_DEVICES / HOSTING_MESSAGES run it at full size.
func TestHostingReport(t *testing.T) {
	devices, messages := 20, 60
	if v, err := strconv.Atoi(os.Getenv("HOSTING_DEVICES")); err == nil {
		devices = v
	}
	if v, err := strconv.Atoi(os.Getenv("HOSTING_MESSAGES")); err == nil {
		messages = v
	}
	if os.Getenv("HOSTING_DEVICES") == "" {
		*hostingBoltDevices, *hostingPeerDevices = 6, 4
	}
	if err := hostingReport(devices, messages); err != nil {
		t.Fatal(err)
	}
	if err := hostingReport(3, 6); err == nil {
		t.Fatal("an odd device count was accepted")
	}
}
