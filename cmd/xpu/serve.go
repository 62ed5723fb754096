package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/serve"
	"github.com/xpuhub/xpu/loader"
	"github.com/xpuhub/xpu/sched"
)

func init() {
	register(&command{name: "serve", summary: "serve a GGUF model over an OpenAI-compatible HTTP API", run: runServe})
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, model := modelFlags("serve", "GGUF model file", stderr)
	host := fs.String("host", "127.0.0.1", "address to listen on")
	port := fs.Int("port", 8080, "port to listen on (0: any free port)")
	name := fs.String("name", "", "model id clients name (default: the file name without .gguf)")
	backend := fs.String("backend", "", "backend name (neon, opencl, qnn, ref) or plugin path (default: the best usable device)")
	policy := fs.String("policy", "", "choose the device by policy: prefer-npu, prefer-gpu, prefer-cpu, max-performance (default), max-efficiency")
	device := fs.Int("device", 0, "device index within --backend")
	parallel := fs.Int("parallel", 1, "requests generating at once: a KV cache each, their decodes batched into one step on one copy of the weights")
	maxTokens := fs.Int("max-tokens", serve.DefaultMaxTokens, "most tokens one request may ask for")
	maxBody := fs.Int64("max-body", serve.DefaultMaxBodyBytes, "largest request body in bytes")
	maxQueue := fs.Int("max-queue", serve.DefaultMaxQueue, "requests that may wait for a runner before 429")
	timeout := fs.Duration("timeout", serve.DefaultRequestTimeout, "longest a request may take, queueing included")
	headerTimeout := fs.Duration("header-timeout", serve.DefaultHeaderTimeout, "longest a client may take to send a request's headers")
	readTimeout := fs.Duration("read-timeout", serve.DefaultReadTimeout, "longest a client may take to send a whole request, headers and body")
	idleTimeout := fs.Duration("idle-timeout", serve.DefaultIdleTimeout, "longest a kept-alive connection may wait for its next request")
	writeTimeout := fs.Duration("write-timeout", serve.DefaultWriteTimeout, "longest one write of a response (one event of a stream) may wait on a client that does not read")
	maxConns := fs.Int("max-conns", 0, "most connections open at once, past it a new one gets 503 (0: the file limit less 128, at most 4096)")
	maxPerClient := fs.Int("max-conns-per-client", serve.DefaultMaxConnsPerClient, "most connections one client address may hold at once (0: no limit; raise it behind a proxy)")
	grace := fs.Duration("shutdown-timeout", 30*time.Second, "on SIGTERM/SIGINT, how long requests in flight may take to finish")
	ctxLen := fs.Int("ctx", 0, "context length in tokens (default: the model's, at most 4096)")
	fs.IntVar(ctxLen, "c", 0, "alias of --ctx")
	chunk := fs.Int("chunk", llm.DefaultChunk, "prefill chunk length")
	threads := fs.Int("threads", 0, "worker threads for CPU backends (0 = the backend's default)")
	fs.IntVar(threads, "t", 0, "alias of --threads")
	isolated := fs.Bool("isolated", false, "run the backend in a child process")
	noSpecial := fs.Bool("no-special", false, "/v1/completions: encode control-token texts in a prompt (\"<|im_start|>\") as plain text; by default they become the control tokens, as in llama.cpp's server (chat messages never do)")
	kvf := addKVFlags(fs)
	shift := fs.Bool("context-shift", true, "when a request's context is full, keep its first n_keep tokens (a request parameter, default 0), discard half of the rest and go on, as llama-server does; max_tokens may then exceed the room the prompt leaves")
	noShift := fs.Bool("no-context-shift", false, "stop a request's generation when its context is full (as --context-shift=false)")
	tmplFile := fs.String("chat-template", "", "Jinja chat template file to use instead of the model's tokenizer.chat_template")
	setUsage(fs, stderr, "usage: xpu serve [--model] F.gguf [--host H] [--port P] [--backend NAME | --policy P] [--parallel N] [--max-tokens N] [--timeout D] [--ctx N] [-ctk f16|q8_0|q4_0|f32] [-ctv f16|q8_0|q4_0|f32] [--no-context-shift]")
	if code, ok := parseInterspersed(fs, args); !ok {
		return code
	}
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "xpu serve: "+format+"\n", a...)
		fs.Usage()
		return 2
	}
	switch {
	case fs.NArg() > 1:
		return bad("one model, got %d arguments: %s", fs.NArg(), strings.Join(fs.Args(), " "))
	case fs.NArg() == 1 && *model != "":
		return bad("the model is given twice (--model %s and %s)", *model, fs.Arg(0))
	case fs.NArg() == 1:
		*model = fs.Arg(0)
	}
	switch {
	case *model == "":
		return bad("no model: give --model F.gguf or the path as the argument")
	case *backend != "" && *policy != "":
		return bad("--backend and --policy both choose the device: give one")
	case *port < 0 || *port > 65535:
		return bad("--port %d: must be 0 to 65535", *port)
	case *threads < 0:
		return bad("--threads %d: must be 0 (the backend's default) or more", *threads)
	case *ctxLen < 0:
		return bad("--ctx %d: must be 0 (the model's) or more", *ctxLen)
	case *chunk < 1:
		return bad("--chunk %d: must be 1 or more", *chunk)
	case *device < 0:
		return bad("--device %d: must be 0 or more", *device)
	case *parallel < 1 || *parallel > 64:
		return bad("--parallel %d: must be 1 to 64", *parallel)
	case *maxTokens < 1:
		return bad("--max-tokens %d: must be 1 or more", *maxTokens)
	case *maxBody < 1:
		return bad("--max-body %d: must be 1 or more", *maxBody)
	case *maxQueue < 0:
		return bad("--max-queue %d: must be 0 or more", *maxQueue)
	case *timeout <= 0:
		return bad("--timeout %s: must be positive", *timeout)
	case *grace <= 0:
		return bad("--shutdown-timeout %s: must be positive", *grace)
	case *headerTimeout <= 0 || *readTimeout <= 0 || *idleTimeout <= 0 || *writeTimeout <= 0:
		return bad("--header-timeout, --read-timeout, --idle-timeout and --write-timeout must be positive")
	case *maxConns < 0:
		return bad("--max-conns %d: must be 0 (automatic) or more", *maxConns)
	case *maxPerClient < 0:
		return bad("--max-conns-per-client %d: must be 0 (no limit) or more", *maxPerClient)
	}
	if *maxConns == 0 {
		*maxConns = autoMaxConns()
	}
	if *name == "" {
		*name = strings.TrimSuffix(filepath.Base(*model), ".gguf")
	}
	kvOpts, err := kvf.options()
	if err != nil {
		return bad("%v", err)
	}
	fail := failer(stderr, "xpu serve")

	lopts := []llm.LoadOption{llm.WithRunnerOptions(append(kvOpts, llm.WithChunkSize(*chunk), llm.WithContextLength(*ctxLen))...)}
	if *threads > 0 {
		lopts = append(lopts, llm.WithRunnerOptions(llm.WithContextOptions(map[string]string{"threads": fmt.Sprint(*threads)})))
	}
	if *isolated {
		lopts = append(lopts, llm.WithSource(loader.NewSource(loader.Isolated())))
	}
	if *backend != "" {
		lopts = append(lopts, llm.WithBackend(*backend), llm.WithDevice(*device))
	}
	if *policy != "" {
		p, err := sched.ParsePolicy(*policy)
		if err != nil {
			return bad("--policy: %v", err)
		}
		lopts = append(lopts, llm.WithPolicy(p))
	}
	var sopts []serve.Option
	if *shift && !*noShift {
		sopts = append(sopts, serve.WithContextShift())
	}
	if *noSpecial {
		sopts = append(sopts, serve.WithoutSpecialTokens())
	}
	if *tmplFile != "" {
		src, err := os.ReadFile(*tmplFile)
		if err != nil {
			return bad("--chat-template: %v", err)
		}
		sopts = append(sopts, serve.WithChatOptions(llm.WithChatTemplate(string(src))))
	}
	t0 := time.Now()
	sopts = append(sopts, serve.WithModelName(*name), serve.WithParallel(*parallel),
		serve.WithMaxTokens(*maxTokens), serve.WithMaxBodyBytes(*maxBody), serve.WithMaxQueue(*maxQueue),
		serve.WithRequestTimeout(*timeout), serve.WithHeaderTimeout(*headerTimeout), serve.WithReadTimeout(*readTimeout),
		serve.WithIdleTimeout(*idleTimeout), serve.WithWriteTimeout(*writeTimeout), serve.WithMaxConns(*maxConns),
		serve.WithMaxConnsPerClient(*maxPerClient))
	// the model is loaded again, by the same options, when its file is replaced on disk
	open := func(ctx context.Context, extra ...serve.Option) (*serve.Server, *llm.Engine, error) {
		eng, err := llm.Load(ctx, *model, lopts...)
		if err != nil {
			return nil, nil, err
		}
		srv, err := serve.New(ctx, eng, append(slices.Clip(sopts), extra...)...)
		if err != nil {
			_ = eng.Close()
			return nil, nil, err
		}
		return srv, eng, nil
	}
	rl, err := serve.NewReloader(ctx, open)
	if err != nil {
		return fail(err)
	}
	defer rl.Close()
	srv := rl.Server()
	eng := srv.Engine()

	ln, err := net.Listen("tcp", net.JoinHostPort(*host, fmt.Sprint(*port)))
	if err != nil {
		return fail(err)
	}
	hs := srv.HTTPServer()
	hs.Handler = rl
	ln = srv.Listener(ln)
	fmt.Fprintf(stderr, "xpu serve: %s on %s (%s), %d runner(s), context %d; loaded in %.0f ms\n",
		*name, eng.Device().Info().ID(), deviceTag(eng.Device().Info()), *parallel, eng.ContextLength(), ms(time.Since(t0)))
	printKVCache(stderr, eng.Runner)
	fmt.Fprintf(stderr, "xpu serve: listening on http://%s\n", ln.Addr())

	sigCtx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	select {
	case err := <-served:
		return fail(err)
	case <-sigCtx.Done():
	}
	fmt.Fprintf(stderr, "xpu serve: shutting down: finishing the requests in flight (at most %s)\n", *grace)
	shutCtx, cancel := context.WithTimeout(context.Background(), *grace)
	defer cancel()
	if err := hs.Shutdown(shutCtx); err != nil {
		_ = hs.Close()
		return fail(fmt.Errorf("shutdown: %w", err))
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fail(err)
	}
	fmt.Fprintln(stderr, "xpu serve: stopped")
	return 0
}

// autoMaxConns is --max-conns's default: the open-file limit less a reserve for the model, the
// plugins and the process's own files, so that the server refuses connections with a 503
// before accept starts failing; at most 4096, at least 16.
func autoMaxConns() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur > 1<<20 {
		return 4096
	}
	return int(max(16, min(4096, int64(lim.Cur)-128)))
}

// deviceTag says what kind of device it is, and that it is emulated when it is.
func deviceTag(info core.DeviceInfo) string {
	tag := info.Kind.String()
	if info.Caps.Has(core.CapEmulated) {
		tag += ", emulated"
	}
	return tag
}
