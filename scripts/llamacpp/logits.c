// llamacpp-logits: runs a token sequence through a GGUF model in llama.cpp and prints, as one
// JSON object, the logits of the first positions and the greedy continuation. xpu's
// llamacpp-check compares them with its own (cmd/xpu/llamacpp_arch_test.go); tokens go in as
// ids, so the two tokenizers are not part of the comparison.
//
//   llamacpp-logits -m MODEL -p 1,5,9 [-n 32] [-k POSITIONS] [-c CONTEXT] [-t THREADS] [--kv f32|f16] [-d DIR]
//
// -d DIR writes every f32 tensor llama.cpp computes for the prompt batch (its graph's named
// nodes: inp_scaled, attn_norm-0, l_out-0, ..., result_output) to DIR/NAME.f32, raw
// little-endian floats in ggml's order (ne[0] fastest), so a disagreement can be traced to the
// first node where the two sides part (the names are llama.cpp's cb() names).
//
// Exit status: 0, 1 (an error), 2 (usage), 3 (llama.cpp refused the context, e.g. the KV type).
//
// Output: {"n_vocab":V,"prompt":[...],"tokens":[...],"logits":[[...],...]} where tokens are the
// n greedy ids after the prompt (argmax, the lowest id on a tie) and logits row i is the
// distribution after token i of prompt+tokens, for the first k positions (default: the prompt).
// The context is the model's training context unless -c says otherwise: the context length
// picks between some models' RoPE factors (Phi-3's LongRoPE short and long), so it must be the
// one the other side runs at.
//
// It builds against the llama.h of upstream llama.cpp (early 2025) and of ik_llama.cpp, so it
// uses only the calls both declare with the same signature (llama_model_load_from_file,
// llama_init_from_model, llama_model_get_vocab, llama_vocab_n_tokens, llama_batch_init).
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-backend.h"
#include "llama.h"

static void quiet_log(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    // llama.cpp logs every tensor it loads at INFO; only its errors say why a file was refused.
    if (level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

// dump_state is the eval callback's: where tensors go, and whether the prompt batch is running.
struct dump_state {
    const char *dir;
    int on;
    int failed;
};

// dump_tensor is llama.cpp's eval callback: asked first whether it wants a node (it wants every
// named f32 node while on), then handed the computed node.
static bool dump_tensor(struct ggml_tensor *t, bool ask, void *user) {
    struct dump_state *d = user;
    if (!d->on || t->type != GGML_TYPE_F32 || t->name[0] == '\0' || !ggml_is_contiguous(t)) {
        return ask ? false : true;
    }
    if (ask) {
        return true;
    }
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s.f32", d->dir, t->name) >= (int)sizeof path) {
        d->failed = 1;
        return true;
    }
    for (char *c = path + strlen(d->dir) + 1; *c != '\0'; c++) {
        if (*c == '/' || *c == ' ') {
            *c = '_';
        }
    }
    const size_t n = ggml_nbytes(t);
    void *buf = malloc(n);
    FILE *f = buf != NULL ? fopen(path, "wb") : NULL;
    if (f == NULL) {
        d->failed = 1;
    } else {
        ggml_backend_tensor_get(t, buf, 0, n);
        if (fwrite(buf, 1, n, f) != n) {
            d->failed = 1;
        }
        if (fclose(f) != 0) {
            d->failed = 1;
        }
    }
    free(buf);
    return true;
}

// ik_llama.cpp's callback returns int where upstream's returns bool: _Generic below picks the
// one of these two that the header declares.
static int dump_tensor_int(struct ggml_tensor *t, bool ask, void *user) { return dump_tensor(t, ask, user); }

static int usage(void) {
    fprintf(stderr, "usage: llamacpp-logits -m MODEL -p ID,ID,... [-n 32] [-k POSITIONS] [-c CONTEXT] [-t THREADS] [--kv f32|f16] [-d DIR]\n");
    return 2;
}

// parse_ids reads a comma-separated list of token ids into a new array.
static int parse_ids(const char *s, llama_token **out, int *n) {
    int cap = 16, len = 0;
    llama_token *ids = malloc(sizeof *ids * (size_t)cap);
    if (ids == NULL) {
        return -1;
    }
    while (*s != '\0') {
        char *end = NULL;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno != 0 || v < 0 || v > 0x7fffffffL || (*end != ',' && *end != '\0')) {
            free(ids);
            return -1;
        }
        if (len == cap) {
            cap *= 2;
            llama_token *grown = realloc(ids, sizeof *ids * (size_t)cap);
            if (grown == NULL) {
                free(ids);
                return -1;
            }
            ids = grown;
        }
        ids[len++] = (llama_token)v;
        s = *end == ',' ? end + 1 : end;
    }
    if (len == 0) {
        free(ids);
        return -1;
    }
    *out = ids;
    *n = len;
    return 0;
}

static int argmax(const float *xs, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) {
        if (xs[i] > xs[best]) {
            best = i;
        }
    }
    return best;
}

// print_row prints one row of logits, or fails on a non-finite value (JSON has no NaN).
static int print_row(const float *xs, int n, int pos) {
    putchar('[');
    for (int i = 0; i < n; i++) {
        if (!isfinite(xs[i])) {
            fprintf(stderr, "llamacpp-logits: logit %d of position %d is %g\n", i, pos, (double)xs[i]);
            return -1;
        }
        printf(i ? ",%.9g" : "%.9g", (double)xs[i]);
    }
    putchar(']');
    return 0;
}

int main(int argc, char **argv) {
    const char *model_path = NULL, *prompt = NULL;
    struct dump_state dump = {0};
    int n_predict = 32, n_keep = -1, n_threads = 1, n_ctx = 0;
    enum ggml_type kv = GGML_TYPE_F16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc) {
            return usage();
        }
        const char *v = argv[++i];
        if (strcmp(a, "-m") == 0) {
            model_path = v;
        } else if (strcmp(a, "-p") == 0) {
            prompt = v;
        } else if (strcmp(a, "-n") == 0) {
            n_predict = atoi(v);
        } else if (strcmp(a, "-k") == 0) {
            n_keep = atoi(v);
        } else if (strcmp(a, "-c") == 0) {
            n_ctx = atoi(v);
        } else if (strcmp(a, "-t") == 0) {
            n_threads = atoi(v);
        } else if (strcmp(a, "-d") == 0) {
            dump.dir = v;
        } else if (strcmp(a, "--kv") == 0 && strcmp(v, "f32") == 0) {
            kv = GGML_TYPE_F32;
        } else if (strcmp(a, "--kv") == 0 && strcmp(v, "f16") == 0) {
            kv = GGML_TYPE_F16;
        } else {
            return usage();
        }
    }
    llama_token *ids = NULL;
    int n_prompt = 0;
    if (model_path == NULL || prompt == NULL || n_predict < 0 || n_threads < 1 || n_ctx < 0 || parse_ids(prompt, &ids, &n_prompt) != 0) {
        return usage();
    }
    if (n_keep < 0) {
        n_keep = n_prompt;
    }
    const int n_total = n_prompt + n_predict;
    if (n_keep > n_total) {
        n_keep = n_total;
    }

    llama_log_set(quiet_log, NULL);
    llama_backend_init();
    int rc = 1;
    struct llama_context *ctx = NULL;
    struct llama_batch batch = llama_batch_init(n_prompt, 0, 1);
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(model_path, mp);
    if (model == NULL) {
        fprintf(stderr, "llamacpp-logits: llama.cpp could not load %s\n", model_path);
        goto out;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    for (int i = 0; i < n_prompt; i++) {
        if (ids[i] >= n_vocab) {
            fprintf(stderr, "llamacpp-logits: token %d is outside the vocabulary (%d)\n", ids[i], n_vocab);
            goto out;
        }
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n_ctx;
    cp.n_batch = (uint32_t)n_prompt;
    cp.n_ubatch = (uint32_t)n_prompt;
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    cp.type_k = kv;
    cp.type_v = kv;
    if (dump.dir != NULL) {
        cp.cb_eval = _Generic(cp.cb_eval, bool (*)(struct ggml_tensor *, bool, void *): dump_tensor, default: dump_tensor_int);
        cp.cb_eval_user_data = &dump;
    }
    if (kv == GGML_TYPE_F32) {
        // Upstream's plain attention (its default) takes an f32 cache; ik_llama.cpp's CPU flash
        // attention (its default) does not, and its plain path refuses any V but f16, so there
        // the context fails (exit 3) and the caller asks for f16.
        cp.flash_attn = false;
    }
    ctx = llama_init_from_model(model, cp);
    if (ctx == NULL) {
        fprintf(stderr, "llamacpp-logits: llama.cpp could not create a context for %s with a %s KV cache\n",
                model_path, kv == GGML_TYPE_F32 ? "f32" : "f16");
        rc = 3;
        goto out;
    }

    if ((int)llama_n_ctx(ctx) < n_total) {
        fprintf(stderr, "llamacpp-logits: the context (%u) is shorter than the %d tokens to run\n", llama_n_ctx(ctx), n_total);
        goto out;
    }

    // The prompt in one batch, every position's logits kept.
    for (int i = 0; i < n_prompt; i++) {
        batch.token[i] = ids[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = n_prompt;
    dump.on = dump.dir != NULL;
    if (llama_decode(ctx, batch) != 0) {
        fprintf(stderr, "llamacpp-logits: llama_decode failed on the prompt\n");
        goto out;
    }
    dump.on = 0;
    if (dump.failed) {
        fprintf(stderr, "llamacpp-logits: could not write the tensors to %s\n", dump.dir);
        goto out;
    }
    printf("{\"n_vocab\":%d,\"prompt\":[", n_vocab);
    for (int i = 0; i < n_prompt; i++) {
        printf(i ? ",%d" : "%d", ids[i]);
    }
    printf("],\"logits\":[");
    for (int i = 0; i < n_prompt && i < n_keep; i++) {
        if (i) {
            putchar(',');
        }
        if (print_row(llama_get_logits_ith(ctx, i), n_vocab, i) != 0) {
            goto out;
        }
    }
    // Greedy continuation, one token per decode; a generated token's logits row is the one after
    // it, so the last token is decoded only when its row is wanted.
    llama_token *gen = malloc(sizeof *gen * (size_t)(n_predict > 0 ? n_predict : 1));
    if (gen == NULL) {
        goto out;
    }
    const float *last = llama_get_logits_ith(ctx, n_prompt - 1);
    for (int g = 0; g < n_predict; g++) {
        gen[g] = (llama_token)argmax(last, n_vocab);
        const int pos = n_prompt + g;
        if (g + 1 == n_predict && pos >= n_keep) {
            break;
        }
        batch.token[0] = gen[g];
        batch.pos[0] = pos;
        batch.n_seq_id[0] = 1;
        batch.seq_id[0][0] = 0;
        batch.logits[0] = 1;
        batch.n_tokens = 1;
        if (llama_decode(ctx, batch) != 0) {
            fprintf(stderr, "llamacpp-logits: llama_decode failed at position %d\n", pos);
            free(gen);
            goto out;
        }
        last = llama_get_logits_ith(ctx, 0);
        if (pos < n_keep) {
            putchar(',');
            if (print_row(last, n_vocab, pos) != 0) {
                free(gen);
                goto out;
            }
        }
    }
    printf("],\"tokens\":[");
    for (int g = 0; g < n_predict; g++) {
        printf(g ? ",%d" : "%d", gen[g]);
    }
    printf("]}\n");
    free(gen);
    rc = fflush(stdout) == 0 ? 0 : 1;

out:
    llama_batch_free(batch);
    if (ctx != NULL) {
        llama_free(ctx);
    }
    if (model != NULL) {
        // llama_free_model is the one name both headers declare (upstream deprecates it for
        // llama_model_free, which ik_llama.cpp lacks).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
        llama_free_model(model);
#pragma GCC diagnostic pop
    }
    llama_backend_free();
    free(ids);
    return rc;
}
