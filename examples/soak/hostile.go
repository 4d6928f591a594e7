package main

import "errors"

func runHostile(o options) error { return errors.New("todo") }

func runHostileScenario(o options) error { return errors.New("todo") }
