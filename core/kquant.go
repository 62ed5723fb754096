package core

import (
	"encoding/binary"
	"math"
)

// K-quants: GGUF's block_q2_K … block_q6_K (abi/OPS.md, "K-quants"). The quantizers follow
// ggml's quantize_row_qN_K_ref, operation for operation in float32, so that the bytes equal
// llama-quantize's (without an importance matrix). Every product that C evaluates as a separate
// float multiply is wrapped in float32() here: the Go spec lets the compiler fuse x*y+z into an
// FMA otherwise, and a fused rounding would change codes.

// kGroupMaxEps is ggml's GROUP_MAX_EPS: a sub-block whose largest magnitude is below it is zero.
const kGroupMaxEps = 1e-15

// nearestInt is ggml's nearest_int: round half to even by adding 1.5·2^23, which leaves the
// rounded integer in the low mantissa bits. Valid for |v| <= 4194303; outside that range (and
// for NaN) C's result is undefined and ours is some int that the callers clamp.
func nearestInt(v float32) int {
	f := v + 12582912
	return int(math.Float32bits(f)&0x7fffff) - 0x400000
}

func clampInt(v, lo, hi int) int { return min(max(v, lo), hi) }

func absf(x float32) float32 { return math.Float32frombits(math.Float32bits(x) &^ (1 << 31)) }

func f16at(b []byte, off int) float32 { return F16ToF32(binary.LittleEndian.Uint16(b[off:])) }

func putF16(b []byte, off int, f float32) { binary.LittleEndian.PutUint16(b[off:], F32ToF16(f)) }

// kScaleMin unpacks the 6-bit scale and min of 32-value sub-block j (0..7) from Q4_K/Q5_K's
// 12-byte scales field.
func kScaleMin(j int, q []byte) (sc, m uint8) {
	if j < 4 {
		return q[j] & 63, q[j+4] & 63
	}
	return (q[j+4] & 0xF) | (q[j-4]>>6)<<4, (q[j+4] >> 4) | (q[j]>>6)<<4
}

// q3Scale unpacks Q3_K's signed 6-bit scale of 16-value sub-block t (0..15).
func q3Scale(t int, sc []byte) int {
	var lo byte
	if t < 8 {
		lo = sc[t] & 0xF
	} else {
		lo = sc[t-8] >> 4
	}
	hi := (sc[8+t%4] >> (2 * (t / 4))) & 3
	return int(lo|hi<<4) - 32
}

// dequantKBlock decodes one super-block of dt into out[:QKK].
func dequantKBlock(dt DType, b []byte, out []float32) {
	switch dt {
	case Q4_K, Q5_K:
		d, dmin := f16at(b, 0), f16at(b, 2)
		scales := b[4:16]
		qs, qh := b[16:16+128], []byte(nil)
		if dt == Q5_K {
			qh, qs = b[16:48], b[48:48+128]
		}
		for s := 0; s < 8; s++ {
			sc, m := kScaleMin(s, scales)
			dl, ml := float32(d*float32(sc)), float32(dmin*float32(m))
			c, shift := s/2, 4*(s%2)
			for l := 0; l < 32; l++ {
				q := (qs[32*c+l] >> shift) & 0xF
				if qh != nil {
					q |= ((qh[l] >> s) & 1) << 4
				}
				out[32*s+l] = float32(dl*float32(q)) - ml
			}
		}
	case Q6_K:
		ql, qh, scales := b[0:128], b[128:192], b[192:208]
		d := f16at(b, 208)
		for i := 0; i < QKK; i++ {
			h, j, l := kpos(i)
			q := (ql[64*h+32*(j%2)+l]>>(4*(j/2)))&0xF | ((qh[32*h+l]>>(2*j))&3)<<4
			out[i] = float32(d*float32(int8(scales[i/16]))) * float32(int(q)-32)
		}
	case Q2_K:
		scales, qs := b[0:16], b[16:80]
		d, dmin := f16at(b, 80), f16at(b, 82)
		for i := 0; i < QKK; i++ {
			h, j, l := kpos(i)
			q := (qs[32*h+l] >> (2 * j)) & 3
			sb := scales[i/16]
			dl, ml := float32(d*float32(sb&0xF)), float32(dmin*float32(sb>>4))
			out[i] = float32(dl*float32(q)) - ml
		}
	case Q3_K:
		hmask, qs, scales := b[0:32], b[32:96], b[96:108]
		d := f16at(b, 108)
		for i := 0; i < QKK; i++ {
			h, j, l := kpos(i)
			q := int((qs[32*h+l] >> (2 * j)) & 3)
			if hmask[l]&(1<<(4*h+j)) == 0 {
				q -= 4
			}
			dl := float32(d * float32(q3Scale(i/16, scales)))
			out[i] = dl * float32(q)
		}
	}
}

// kpos places value i of a super-block in the 2-bit plane layout of Q2_K, Q3_K and Q6_K: half h
// (128 values each), 32-value group j within the half, lane l within the group.
func kpos(i int) (h, j, l int) {
	r := i % 128
	return i / 128, r / 32, r % 32
}

// quantKBlock encodes QKK values as one super-block of dt (out is dt.BlockBytes() long, zeroed).
func quantKBlock(dt DType, x []float32, out []byte) {
	switch dt {
	case Q4_K:
		quantQ45K(x, out, 15, -1, 20)
	case Q5_K:
		quantQ45K(x, out, 31, -0.5, 15)
	case Q6_K:
		quantQ6K(x, out)
	case Q2_K:
		quantQ2K(x, out)
	case Q3_K:
		quantQ3K(x, out)
	}
}

// quantQ45K is quantize_row_q4_K_ref (nmax 15) and quantize_row_q5_K_ref (nmax 31).
func quantQ45K(x []float32, out []byte, nmax int, rmin float32, nstep int) {
	var (
		L                [QKK]uint8
		laux             [32]uint8
		weights          [32]float32
		scales, mins     [8]float32
		maxScale, maxMin float32
		sc               = out[4:16]
		five             = nmax == 31
	)
	for j := 0; j < 8; j++ {
		xs := x[32*j : 32*j+32]
		var sumX2 float32
		for _, v := range xs {
			sumX2 += float32(v * v)
		}
		avX := float32(math.Sqrt(float64(sumX2 / 32)))
		for l, v := range xs {
			weights[l] = avX + absf(v)
		}
		scales[j], mins[j] = makeQKX2(nmax, xs, weights[:], L[32*j:32*j+32], laux[:], rmin, 0.1, nstep, false)
		if scales[j] > maxScale {
			maxScale = scales[j]
		}
		if mins[j] > maxMin {
			maxMin = mins[j]
		}
	}
	var invScale, invMin float32
	if maxScale > 0 {
		invScale = 63 / maxScale
	}
	if maxMin > 0 {
		invMin = 63 / maxMin
	}
	for j := 0; j < 8; j++ {
		ls := min(63, uint8(nearestInt(float32(invScale*scales[j]))))
		lm := min(63, uint8(nearestInt(float32(invMin*mins[j]))))
		if j < 4 {
			sc[j], sc[j+4] = ls, lm
		} else {
			sc[j+4] = ls&0xF | (lm&0xF)<<4
			sc[j-4] |= (ls >> 4) << 6
			sc[j] |= (lm >> 4) << 6
		}
	}
	putF16(out, 0, maxScale/63)
	putF16(out, 2, maxMin/63)
	d16, dmin16 := f16at(out, 0), f16at(out, 2)
	for j := 0; j < 8; j++ {
		s, m := kScaleMin(j, sc)
		d := float32(d16 * float32(s))
		if d == 0 {
			continue
		}
		dm := float32(dmin16 * float32(m))
		for ii := 0; ii < 32; ii++ {
			L[32*j+ii] = uint8(clampInt(nearestInt((x[32*j+ii]+dm)/d), 0, nmax))
		}
	}
	if !five {
		qs := out[16:]
		for c := 0; c < 4; c++ {
			for l := 0; l < 32; l++ {
				qs[32*c+l] = L[64*c+l] | L[64*c+32+l]<<4
			}
		}
		return
	}
	qh, ql := out[16:48], out[48:]
	for c := 0; c < 4; c++ {
		m1, m2 := byte(1)<<(2*c), byte(2)<<(2*c)
		for j := 0; j < 32; j++ {
			l1, l2 := L[64*c+j], L[64*c+32+j]
			if l1 > 15 {
				l1 -= 16
				qh[j] |= m1
			}
			if l2 > 15 {
				l2 -= 16
				qh[j] |= m2
			}
			ql[32*c+j] = l1 | l2<<4
		}
	}
}

// makeQKX2 is ggml's make_qkx2_quants: an affine fit x ≈ scale·L − min (min ≥ 0 returned) with
// codes 0..nmax, searching nstep+1 candidate scales for the least weighted error (squared, or
// absolute with useMad).
func makeQKX2(nmax int, x, weights []float32, L, laux []uint8, rmin, rdelta float32, nstep int, useMad bool) (float32, float32) {
	n := len(x)
	lo, hi := x[0], x[0]
	sumW := weights[0]
	sumX := float32(sumW * x[0])
	for i := 1; i < n; i++ {
		// Comparisons, not min/max: they treat -0 and NaN as ggml's C does.
		if x[i] < lo {
			lo = x[i]
		}
		if x[i] > hi {
			hi = x[i]
		}
		w := weights[i]
		sumW += w
		sumX += float32(w * x[i])
	}
	if lo > 0 {
		lo = 0
	}
	if hi == lo {
		for i := range L[:n] {
			L[i] = 0
		}
		return 0, -lo
	}
	fnmax := float32(nmax)
	iscale := fnmax / (hi - lo)
	scale := 1 / iscale
	var bestMad float32
	for i := 0; i < n; i++ {
		l := clampInt(nearestInt(float32(iscale*(x[i]-lo))), 0, nmax)
		L[i] = uint8(l)
		diff := float32(scale*float32(l)) + lo - x[i]
		bestMad += float32(weights[i] * kErr(diff, useMad))
	}
	if nstep < 1 {
		return scale, -lo
	}
	for is := 0; is <= nstep; is++ {
		iscale = (rmin + float32(rdelta*float32(is)) + fnmax) / (hi - lo)
		var sumL, sumL2, sumXL float32
		for i := 0; i < n; i++ {
			l := clampInt(nearestInt(float32(iscale*(x[i]-lo))), 0, nmax)
			laux[i] = uint8(l)
			w := weights[i]
			fl := float32(l)
			wl := float32(w * fl)
			sumL += wl
			sumL2 += float32(wl * fl)
			sumXL += float32(wl * x[i])
		}
		D := float32(sumW*sumL2) - float32(sumL*sumL)
		if D > 0 {
			thisScale := (float32(sumW*sumXL) - float32(sumX*sumL)) / D
			thisMin := (float32(sumL2*sumX) - float32(sumL*sumXL)) / D
			if thisMin > 0 {
				thisMin = 0
				thisScale = sumXL / sumL2
			}
			var mad float32
			for i := 0; i < n; i++ {
				diff := float32(thisScale*float32(laux[i])) + thisMin - x[i]
				mad += float32(weights[i] * kErr(diff, useMad))
			}
			if mad < bestMad {
				copy(L[:n], laux[:n])
				bestMad, scale, lo = mad, thisScale, thisMin
			}
		}
	}
	return scale, -lo
}

// kErr is make_qkx2_quants' error measure: absolute (use_mad) or squared.
func kErr(diff float32, useMad bool) float32 {
	if useMad {
		return absf(diff)
	}
	return float32(diff * diff)
}

// groupMax returns the value of x with the largest magnitude (the first of equals). ok is false
// when that magnitude is below kGroupMaxEps: the group then quantizes to 0, and L's codes for it
// are zeroed.
func groupMax(x []float32, L []int8) (mx float32, ok bool) {
	var amax float32
	for _, v := range x {
		if a := absf(v); a > amax {
			amax, mx = a, v
		}
	}
	if amax < kGroupMaxEps {
		clear(L[:len(x)])
		return 0, false
	}
	return mx, true
}

// subScales fits each of the 16 sub-blocks of 16 values of a super-block with fit (which writes
// their codes into L) and returns the 16 scales and the one of largest magnitude (the first of
// equals), with that magnitude.
func subScales(x []float32, L *[QKK]int8, fit func(x []float32, L []int8) float32) (scales [16]float32, maxScale, maxAbs float32) {
	for ib := range scales {
		s := fit(x[16*ib:16*ib+16], L[16*ib:16*ib+16])
		scales[ib] = s
		if a := absf(s); a > maxAbs {
			maxAbs, maxScale = a, s
		}
	}
	return scales, maxScale, maxAbs
}

// makeQX is ggml's make_qx_quants with rmse_type 1 (weights x²) and no importance weights: a
// symmetric fit with codes −nmax..nmax−1 stored offset by nmax, trying 19 scales around nmax/max.
func makeQX(nmax int, x []float32, L []int8) float32 {
	mx, ok := groupMax(x, L)
	if !ok {
		return 0
	}
	fit := func(iscale float32, store bool) (sumlx, suml2 float32) {
		for i, v := range x {
			l := clampInt(nearestInt(float32(iscale*v)), -nmax, nmax-1)
			if store {
				L[i] = int8(l + nmax)
			}
			fl := float32(l)
			w := float32(v * v)
			sumlx += float32(float32(w*v) * fl)
			suml2 += float32(float32(w*fl) * fl)
		}
		return sumlx, suml2
	}
	iscale := float32(-nmax) / mx
	sumlx, suml2 := fit(iscale, true)
	var scale float32
	if suml2 != 0 {
		scale = sumlx / suml2
	}
	best := float32(scale * sumlx)
	for is := -9; is <= 9; is++ {
		if is == 0 {
			continue
		}
		iscale = -(float32(nmax) + float32(0.1*float32(is))) / mx
		sumlx, suml2 = fit(iscale, false)
		if suml2 > 0 && float32(sumlx*sumlx) > float32(best*suml2) {
			fit(iscale, true)
			scale = sumlx / suml2
			best = float32(scale * sumlx)
		}
	}
	return scale
}

// quantQ6K is quantize_row_q6_K_ref.
func quantQ6K(x []float32, out []byte) {
	var L [QKK]int8
	scales, maxScale, maxAbsScale := subScales(x, &L, func(x []float32, L []int8) float32 { return makeQX(32, x, L) })
	if maxAbsScale < kGroupMaxEps {
		clear(out)
		return
	}
	iscale := -128 / maxScale
	putF16(out, 208, 1/iscale)
	sc := out[192:208]
	for ib := 0; ib < 16; ib++ {
		sc[ib] = byte(int8(min(127, nearestInt(float32(iscale*scales[ib])))))
	}
	d16 := f16at(out, 208)
	for j := 0; j < 16; j++ {
		d := float32(d16 * float32(int8(sc[j])))
		if d == 0 {
			continue
		}
		for ii := 0; ii < 16; ii++ {
			L[16*j+ii] = int8(clampInt(nearestInt(x[16*j+ii]/d), -32, 31) + 32)
		}
	}
	ql, qh := out[0:128], out[128:192]
	for h := 0; h < 2; h++ {
		for l := 0; l < 32; l++ {
			b := 128 * h
			q1, q2, q3, q4 := byte(L[b+l]), byte(L[b+l+32]), byte(L[b+l+64]), byte(L[b+l+96])
			ql[64*h+l] = q1&0xF | (q3&0xF)<<4
			ql[64*h+l+32] = q2&0xF | (q4&0xF)<<4
			qh[32*h+l] = q1>>4 | (q2>>4)<<2 | (q3>>4)<<4 | (q4>>4)<<6
		}
	}
}

// quantQ2K is quantize_row_q2_K_ref.
func quantQ2K(x []float32, out []byte) {
	var (
		L                [QKK]uint8
		laux             [16]uint8
		weights          [16]float32
		scales, mins     [16]float32
		maxScale, maxMin float32
	)
	const q4scale = 15
	for j := 0; j < 16; j++ {
		xs := x[16*j : 16*j+16]
		for l, v := range xs {
			weights[l] = absf(v)
		}
		scales[j], mins[j] = makeQKX2(3, xs, weights[:], L[16*j:16*j+16], laux[:], -0.5, 0.1, 15, true)
		if scales[j] > maxScale {
			maxScale = scales[j]
		}
		if mins[j] > maxMin {
			maxMin = mins[j]
		}
	}
	sc := out[0:16]
	if maxScale > 0 {
		iscale := q4scale / maxScale
		for j := range sc {
			sc[j] = byte(nearestInt(float32(iscale * scales[j])))
		}
		putF16(out, 80, maxScale/q4scale)
	}
	if maxMin > 0 {
		iscale := q4scale / maxMin
		for j := range sc {
			sc[j] |= byte(nearestInt(float32(iscale*mins[j])) << 4)
		}
		putF16(out, 82, maxMin/q4scale)
	}
	d16, dmin16 := f16at(out, 80), f16at(out, 82)
	for j := 0; j < 16; j++ {
		d := float32(d16 * float32(sc[j]&0xF))
		if d == 0 {
			continue
		}
		dm := float32(dmin16 * float32(sc[j]>>4))
		for ii := 0; ii < 16; ii++ {
			L[16*j+ii] = uint8(clampInt(nearestInt((x[16*j+ii]+dm)/d), 0, 3))
		}
	}
	packQ2(L[:], out[16:80])
}

// packQ2 stores 2-bit codes: byte 32h+l holds values 128h+l, +32, +64, +96 in bits 0-1 … 6-7.
func packQ2(L []uint8, qs []byte) {
	for h := 0; h < 2; h++ {
		for l := 0; l < 32; l++ {
			b := 128 * h
			qs[32*h+l] = L[b+l] | L[b+l+32]<<2 | L[b+l+64]<<4 | L[b+l+96]<<6
		}
	}
}

// makeQ3 is ggml's make_q3_quants with do_rmse: a symmetric fit with codes −nmax..nmax−1,
// refined coordinate-wise (up to 5 passes) on the x²-weighted error; codes stored offset by nmax.
func makeQ3(nmax int, x []float32, L []int8) float32 {
	mx, ok := groupMax(x, L)
	if !ok {
		return 0
	}
	iscale := float32(-nmax) / mx
	var sumlx, suml2 float32
	for i, v := range x {
		l := clampInt(nearestInt(float32(iscale*v)), -nmax, nmax-1)
		L[i] = int8(l)
		w := float32(v * v)
		fl := float32(l)
		sumlx += float32(float32(w*v) * fl)
		suml2 += float32(float32(w*fl) * fl)
	}
	for itry := 0; itry < 5; itry++ {
		changed := 0
		for i, v := range x {
			w := float32(v * v)
			fl := float32(L[i])
			slx := sumlx - float32(float32(w*v)*fl)
			if slx > 0 {
				sl2 := suml2 - float32(float32(w*fl)*fl)
				nl := clampInt(nearestInt(float32(v*sl2)/slx), -nmax, nmax-1)
				if nl != int(L[i]) {
					fn := float32(nl)
					slx += float32(float32(w*v) * fn)
					sl2 += float32(float32(w*fn) * fn)
					if sl2 > 0 && float32(float32(slx*slx)*suml2) > float32(float32(sumlx*sumlx)*sl2) {
						L[i] = int8(nl)
						sumlx, suml2 = slx, sl2
						changed++
					}
				}
			}
		}
		if changed == 0 {
			break
		}
	}
	for i := range x {
		L[i] += int8(nmax)
	}
	return sumlx / suml2
}

// quantQ3K is quantize_row_q3_K_ref.
func quantQ3K(x []float32, out []byte) {
	var L [QKK]int8
	scales, maxScale, _ := subScales(x, &L, func(x []float32, L []int8) float32 { return makeQ3(4, x, L) })
	sc := out[96:108]
	if maxScale != 0 {
		iscale := -32 / maxScale
		for j := 0; j < 16; j++ {
			l := int8(nearestInt(float32(iscale * scales[j])))
			l = int8(clampInt(int(l), -32, 31) + 32)
			if j < 8 {
				sc[j] = byte(l) & 0xF
			} else {
				sc[j-8] |= (byte(l) & 0xF) << 4
			}
			l >>= 4
			sc[j%4+8] |= byte(l) << (2 * (j / 4))
		}
		putF16(out, 108, 1/iscale)
	}
	d16 := f16at(out, 108)
	for j := 0; j < 16; j++ {
		d := float32(d16 * float32(q3Scale(j, sc)))
		if d == 0 {
			continue
		}
		for ii := 0; ii < 16; ii++ {
			L[16*j+ii] = int8(clampInt(nearestInt(x[16*j+ii]/d), -4, 3) + 4)
		}
	}
	hmask := out[0:32]
	for j := 0; j < QKK; j++ {
		if L[j] > 3 {
			hmask[j%32] |= 1 << (j / 32)
			L[j] -= 4
		}
	}
	var codes [QKK]uint8
	for i, l := range L {
		codes[i] = uint8(l)
	}
	packQ2(codes[:], out[32:96])
}
