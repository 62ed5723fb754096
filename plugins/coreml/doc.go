// Package coreml is the Core ML backend: it lowers xpu graphs to Core ML ML Programs written as
// .mlpackage folders and runs them through Core ML on Apple systems, or through the emulated
// runtime of emu/ elsewhere (README.md says which ops lower and how).
package coreml
