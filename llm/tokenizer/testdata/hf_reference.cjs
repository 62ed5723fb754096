// Reference token ids for the Go tokenizer tests, from tokenizers.js (@huggingface/tokenizers,
// the tokenizer code of transformers.js). Reads a JSON request on stdin:
//   {"npm": "<build/npm>", "jobs": [{"name", "tokenizer", "config", "pre": [regex...]|null,
//     "ignore_merges": bool|null, "texts": [...]}]}
// and writes {"<name>": [[ids of text 0], ...], ...} on stdout. "pre" replaces the file's
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
    built.set(job.tokenizer, { tok, normalizer: tok.normalizer, pre: tok.pre_tokenizer, ignore: tok.model.ignore_merges });
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
  out[job.name] = job.texts.map((t) => tok.encode(t, { add_special_tokens: false }).ids);
}
process.stdout.write(JSON.stringify(out));
