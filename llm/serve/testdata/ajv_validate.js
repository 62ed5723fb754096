// Validates JSON texts against a JSON Schema with ajv. Input on stdin:
// {"schema": {...}, "texts": ["...", ...]}. Output on stdout: {"checked": n, "failures":
// [{"index": i, "text": "...", "error": "..."}]}. Run with node -e from the folder whose
// node_modules holds ajv (build/npm).
const Ajv = require("ajv/dist/2020");
let input = "";
process.stdin.on("data", (d) => (input += d));
process.stdin.on("end", () => {
  const { schema, texts } = JSON.parse(input);
  const validate = new Ajv({ strict: false, allErrors: true }).compile(schema);
  const failures = [];
  texts.forEach((text, index) => {
    let value;
    try {
      value = JSON.parse(text);
    } catch (e) {
      failures.push({ index, text, error: "not JSON: " + e.message });
      return;
    }
    if (!validate(value)) {
      failures.push({ index, text, error: JSON.stringify(validate.errors) });
    }
  });
  process.stdout.write(JSON.stringify({ checked: texts.length, failures }));
});
