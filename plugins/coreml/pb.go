package coreml

import (
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// Field numbers of the subset of Apple's Core ML specification (Model.proto, FeatureTypes.proto,
// MIL.proto in apple/coremltools mlmodel/format) that an ML Program needs. They are written
// here from the published numbering; the .proto files themselves are not part of this
// repository. The emulator (package emu) keeps its own copy on purpose: it parses what this
// writer produced without sharing a line with it.
const (
	fModelSpecVersion = 1
	fModelDescription = 2
	fModelMLProgram   = 502

	fDescInput  = 1
	fDescOutput = 10

	fFeatName = 1
	fFeatType = 3

	fFeatTypeMultiArray = 5

	fArrayShape    = 1
	fArrayDataType = 2

	fProgVersion   = 1
	fProgFunctions = 2

	fFuncInputs = 1
	fFuncOpset  = 2
	fFuncBlocks = 3

	fBlockOutputs    = 2
	fBlockOperations = 3

	fOpType       = 1
	fOpInputs     = 2
	fOpOutputs    = 3
	fOpAttributes = 5

	fArgArguments = 1
	fBindName     = 1

	fNVTName = 1
	fNVTType = 2

	fValueTypeTensor = 1

	fTensorDataType = 1
	fTensorRank     = 2
	fTensorDims     = 3

	fDimConstant = 1
	fConstSize   = 1

	fValueType      = 2
	fValueImmediate = 3
	fValueBlob      = 5

	fImmTensor = 1

	fTVFloats  = 1
	fTVInts    = 2
	fTVBools   = 3
	fTVStrings = 4

	fBlobFileName = 1
	fBlobOffset   = 2

	fMapKey   = 1
	fMapValue = 2
)

// ArrayFeatureType.ArrayDataType values (the multi-array types of a model's inputs and outputs).
const (
	arrayFloat32 = 0x10000 | 32
	arrayFloat16 = 0x10000 | 16
	arrayInt32   = 0x20000 | 32
)

// msg is a protobuf message being written.
type msg []byte

func (m msg) bytes(f protowire.Number, b []byte) msg {
	m = protowire.AppendTag(m, f, protowire.BytesType)
	return protowire.AppendBytes(m, b)
}

func (m msg) str(f protowire.Number, s string) msg { return m.bytes(f, []byte(s)) }

func (m msg) varint(f protowire.Number, v uint64) msg {
	m = protowire.AppendTag(m, f, protowire.VarintType)
	return protowire.AppendVarint(m, v)
}

// mapEntry writes one entry of a map<string, M> field.
func (m msg) mapEntry(f protowire.Number, key string, val msg) msg {
	return m.bytes(f, msg(nil).str(fMapKey, key).bytes(fMapValue, val))
}

func packedFloats(xs []float32) []byte {
	var b []byte
	for _, x := range xs {
		b = protowire.AppendFixed32(b, math.Float32bits(x))
	}
	return b
}

func packedVarints(xs []int64) []byte {
	var b []byte
	for _, x := range xs {
		b = protowire.AppendVarint(b, uint64(x))
	}
	return b
}
