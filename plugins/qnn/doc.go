// Package qnn holds the Go tests of the QNN NPU plugin (libxpu-qnn.so, C11 in src/): they run the
// conformance suite on the built plugin over the clean-room QNN provider of emu/ and check its
// context options, context-binary cache, W8A8 blocks and probing (README.md describes the plugin).
package qnn
