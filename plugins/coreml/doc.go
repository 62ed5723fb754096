// Package coreml is the built-in Core ML backend: it lowers graphs to ML Program packages and
// runs them through Core ML from Go (the Objective-C runtime, no cgo) on Apple systems, and on
// the emulated Core ML runtime (package emu) elsewhere. Importing it registers "coreml" in
// core's backend registry.
package coreml
