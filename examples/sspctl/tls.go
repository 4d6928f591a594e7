package main

import (
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/syncmesh/syncmesh/runtime/meshtls"
)

// ---- tls ca / tls node ----

func tlsCAFlags(fs *flag.FlagSet) func(env, *flag.FlagSet) error {
	dir := fs.String("dir", "", "directory for ca.pem and ca.key (required)")
	name := fs.String("name", "syncmesh mesh CA", "the CA's common name")
	days := fs.Int("days", 3650, "validity in days")
	return func(e env, fs *flag.FlagSet) error {
		if err := require(fs, "dir"); err != nil {
			return err
		}
		if *days <= 0 {
			return inputErr("--days must be positive")
		}
		if _, err := os.Stat(filepath.Join(*dir, "ca.pem")); err == nil {
			return fmt.Errorf("%s already holds a CA (ca.pem): refusing to replace it", *dir)
		}
		ca, err := meshtls.NewCA(*name, time.Duration(*days)*24*time.Hour)
		if err != nil {
			return err
		}
		if err := ca.Save(*dir); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "ca=%s key=%s expires=%s\n", filepath.Join(*dir, "ca.pem"), filepath.Join(*dir, "ca.key"), ca.Cert.NotAfter.UTC().Format(time.RFC3339))
		return nil
	}
}

func tlsNodeFlags(fs *flag.FlagSet) func(env, *flag.FlagSet) error {
	dir := fs.String("dir", "", "directory holding the CA (ca.pem, ca.key); the node's NAME.pem and NAME.key are written there (required)")
	name := fs.String("name", "", "node name (or a hosting member's name): the certificate's common name, DNS SAN and URI SAN syncmesh://node/NAME (required)")
	hosts := fs.String("host", "127.0.0.1", "comma-separated IP addresses and DNS names peers dial the node at")
	days := fs.Int("days", 365, "validity in days")
	return func(e env, fs *flag.FlagSet) error {
		if err := require(fs, "dir", "name"); err != nil {
			return err
		}
		if *days <= 0 {
			return inputErr("--days must be positive")
		}
		if err := meshtls.ValidateName(*name); err != nil {
			return inputErr("%v", err)
		}
		ca, err := meshtls.LoadCA(*dir)
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("no CA in %s: run sspctl tls ca --dir %s first", *dir, *dir)
		}
		if err != nil {
			return err
		}
		nc, err := ca.Issue(*name, meshtls.NodeOptions{Hosts: splitList(*hosts), Validity: time.Duration(*days) * 24 * time.Hour})
		if err != nil {
			return err
		}
		if err := nc.Save(*dir); err != nil {
			return err
		}
		pin := meshtls.PublicKeyPin(nc.Cert)
		fmt.Fprintf(e.stdout, "cert=%s key=%s uri=%s pin-sha256=%s expires=%s\n",
			filepath.Join(*dir, *name+".pem"), filepath.Join(*dir, *name+".key"), meshtls.NodeURI(*name), hex.EncodeToString(pin[:]), nc.Cert.NotAfter.UTC().Format(time.RFC3339))
		return nil
	}
}
