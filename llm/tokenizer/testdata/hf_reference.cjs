// Reference token ids for the Go tokenizer tests, from tokenizers.js (@huggingface/tokenizers,
// the tokenizer code of transformers.js). Reads a JSON request on stdin:
//   {"npm": "<build/npm>", "jobs": [{"name", "tokenizer", "config", "pre": [regex...]|null,
//     "ignore_merges": bool|null, "texts": [...]}]}
// and writes {"<name>": {"ids": [[ids of text 0], ...], "ranks": [...]}, ...} on stdout, where
// ranks (with "ranks": true in the job) gives each token id the rank of the first merge that
// makes it, or -1: the order a SentencePiece model's scores give. "pre" replaces the file's
// pre-tokenizer by those regexes in turn (Split, Isolated) and byte-level mapping, so one
// vocabulary can check every pre-tokenizer family.
const fs = require("fs");
const path = require("path");
const { createRequire } = require("module");

const req = JSON.parse(fs.readFileSync(0, "utf8"));
const hf = createRequire(path.join(req.npm, "package.json"))("@huggingface/tokenizers");

// One Tokenizer per file: building one from a large vocabulary takes seconds, so the family
// jobs swap the pre-tokenizer of a built one instead of building their own.
const built = new Map();
function load(job) {
  if (!built.has(job.tokenizer)) {
    const json = JSON.parse(fs.readFileSync(job.tokenizer, "utf8"));
    const config = job.config ? JSON.parse(fs.readFileSync(job.config, "utf8")) : {};
    const tok = new hf.Tokenizer(json, config);
    built.set(job.tokenizer, { tok, json, normalizer: tok.normalizer, pre: tok.pre_tokenizer, ignore: tok.model.ignore_merges });
  }
  return built.get(job.tokenizer);
}

const out = {};
for (const job of req.jobs) {
  const b = load(job);
  const tok = b.tok;
  tok.normalizer = b.normalizer;
  tok.pre_tokenizer = b.pre;
  tok.model.ignore_merges = b.ignore;
  if (job.pre) {
    tok.normalizer = null;
    tok.pre_tokenizer = new hf.SequencePreTokenizer({
      type: "Sequence",
      pretokenizers: [
        ...job.pre.map((r) => ({ type: "Split", pattern: { Regex: r }, behavior: "Isolated", invert: false })),
        { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false },
      ],
    });
  }
  if (job.ignore_merges !== null && job.ignore_merges !== undefined) tok.model.ignore_merges = job.ignore_merges;
  tok.model.clear_cache(); // its cache holds words encoded under the previous job's settings
  const res = { ids: job.texts.map((t) => tok.encode(t, { add_special_tokens: false }).ids), ranks: null };
  if (job.ranks) {
    const vocab = b.json.model.vocab;
    res.ranks = new Array(Object.keys(vocab).length).fill(-1);
    b.json.model.merges.forEach((m, r) => {
      const [x, y] = Array.isArray(m) ? m : m.split(" ", 2);
      const id = vocab[x + y];
      if (id !== undefined && res.ranks[id] < 0) res.ranks[id] = r;
    });
  }
  out[job.name] = res;
}
process.stdout.write(JSON.stringify(out));
