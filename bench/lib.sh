# shellcheck shell=bash
# bench/lib.sh: what every benchmark harness in bench/ shares. Source it first:
#
#   . "$(dirname "$0")/lib.sh"
#
# It gives
#   median              the median of the numbers on stdin, one per line (mean of the middle
#                       two for an even count; nothing for none)
#   load1               the 1-minute load average
#   load_line [LABEL]   "load LABEL: 1 5 15" (the three load averages), for a harness's log
#   trim S              S without leading and trailing blanks
#   interleave N FUNC ITEM...
#                       N rounds; each round calls `FUNC ROUND ITEM` once per item, the items'
#                       order rotated by one every round, so that a load change on a shared
#                       machine hits every item alike
#   cpu_model           the CPU's model name
#   isa_path            the SIMD path xpu's neon plugin takes here, as its device names it
#                       ("neon AVX-512 build, int8: AVX-512 VNNI"), else from the CPU's flags
#                       (avx512, avx2, portable, arm64 neon [+dotprod])
#   read_bandwidth N    the machine's read bandwidth in GB/s with N cores (llm's
#                       BenchmarkReadBandwidth pinned to cores 0..N-1)
#   machine             one line: CPU model, ISA path, 1- and 2-core read bandwidth
#                       (BENCH_BANDWIDTH=0 leaves the bandwidth out: it costs a test build
#                       and a few seconds of reading)
#   record_result AREA NAME VALUE UNIT COMMAND [NOTE]
#                       stores one figure (NOTE: what it is compared with, the ratio) in lab/results/AREA.jsonl with the machine, the
#                       commit and the date, replacing an earlier figure of the same AREA and
#                       NAME on the same machine (BENCH_RESULTS: another results folder);
#                       `make perf-table` renders docs/PERFORMANCE.md from them
#
# BENCH_ROOT is the repository root.
BENCH_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

median() {
	sort -g | awk '{ a[NR] = $1 } END { if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'
}

load1() { cut -d' ' -f1 /proc/loadavg; }

# trim S: S without leading and trailing blanks
trim() {
	local s=$1
	s=${s#"${s%%[![:space:]]*}"}
	echo "${s%"${s##*[![:space:]]}"}"
}

load_line() { echo "load${1:+ $1}: $(cut -d' ' -f1-3 /proc/loadavg)"; }

interleave() {
	local n=$1 fn=$2 r i k
	shift 2
	local items=("$@") m=$#
	for ((r = 1; r <= n; r++)); do
		for ((i = 0; i < m; i++)); do
			k=$(((i + r - 1) % m))
			"$fn" "$r" "${items[$k]}"
		done
	done
}

cpu_model() {
	local m
	m=$(sed -n 's/^model name[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo | head -1)
	[ -n "$m" ] || m=$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
	echo "${m:-unknown CPU} ($(nproc) cores)"
}

# The neon plugin's own word first: its device name carries its build and the int8 path its
# kernels take ("AVX-512 build, int8: AVX-512 VNNI"); where xpu is not built, the same order as
# the loader's choice among plugins/neon's builds, from the CPU's flags.
isa_path() {
	local flags xpu=${XPU:-$BENCH_ROOT/build/xpu} own
	if [ -x "$xpu" ]; then
		own=$("$xpu" devices 2>/dev/null | sed -n 's/^neon .*(\(.*int8: [^)]*\)).*/\1/p' | head -1)
		if [ -n "$own" ]; then
			echo "neon $own"
			return
		fi
	fi
	case "$(uname -m)" in
	aarch64 | arm64)
		if grep -qw asimddp /proc/cpuinfo; then echo "arm64 neon+dotprod"; else echo "arm64 neon"; fi
		return
		;;
	esac
	flags=" $(grep -m1 '^flags' /proc/cpuinfo) "
	if [[ $flags == *" avx512f "* && $flags == *" avx512bw "* && $flags == *" avx512vl "* ]]; then
		echo avx512
	elif [[ $flags == *" avx2 "* && $flags == *" fma "* && $flags == *" f16c "* ]]; then
		echo avx2
	else
		echo portable
	fi
}

_bench_llm_test=
read_bandwidth() {
	local n=$1 cpus
	cpus=$(seq -s, 0 $((n - 1)))
	if [ -z "$_bench_llm_test" ]; then
		_bench_llm_test=$(mktemp -d)/llm.test
		(cd "$BENCH_ROOT" && go test -c -o "$_bench_llm_test" ./llm) >&2 || return 1
	fi
	(cd "$BENCH_ROOT/llm" && taskset -c "$cpus" "$_bench_llm_test" -test.run '^$' -test.bench ReadBandwidth \
		-test.benchtime 10x -test.cpu "$n") | sed -nE 's/.* ([0-9.]+) GB\/s$/\1/p'
}

machine() {
	local bw=""
	if [ "${BENCH_BANDWIDTH:-1}" != 0 ]; then
		bw=", read $(read_bandwidth 1) GB/s (1 core), $(read_bandwidth 2) GB/s (2 cores)"
	fi
	echo "$(cpu_model), $(isa_path)$bw"
}

_bench_machine=
record_result() {
	local area=$1 name=$2 value=$3 unit=$4 cmd=$5 note=${6:-} commit
	[ -n "$_bench_machine" ] || _bench_machine=$(machine)
	commit=$(git -C "$BENCH_ROOT" rev-parse --short=10 HEAD 2>/dev/null || echo unknown)
	(cd "$BENCH_ROOT" && go run ./lab/perfgen record --results "${BENCH_RESULTS:-lab/results}" --area "$area" --name "$name" --value "$value" \
		--unit "$unit" --note "$note" --machine "$_bench_machine" --commit "$commit" --date "$(date -u +%F)" --command "$cmd")
}
