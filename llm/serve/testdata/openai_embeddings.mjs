// The `openai` npm client asking the server for embeddings: by default it requests base64 and
// decodes it, and with encoding_format "float" it takes the numbers as they are. Run by
// TestOpenAIClientEmbeddings with the base URL and model id; prints what it saw as JSON.
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 60000 });
const input = ["Once upon a time", "Tom had a red ball."];
const b64 = await client.embeddings.create({ model, input });
const floats = await client.embeddings.create({ model, input, encoding_format: "float" });
console.log(JSON.stringify({
  object: b64.object,
  model: b64.model,
  usage: b64.usage,
  base64: b64.data.map((d) => ({ index: d.index, embedding: Array.from(d.embedding) })),
  float: floats.data.map((d) => ({ index: d.index, embedding: d.embedding })),
}));
