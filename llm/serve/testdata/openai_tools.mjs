// The `openai` npm client parsing tool calls from the server, whole and streamed. Run by
// TestOpenAIClientToolCalls with the base URL and model id; prints what it saw as JSON.
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 60000 });
const tools = [{ type: "function", function: { name: "get_weather", description: "Weather of a city",
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];
const messages = [{ role: "user", content: "Weather in Paris?" }];
const out = {};

const whole = await client.chat.completions.create({ model, tools, messages });
const c = whole.choices[0];
out.whole = { finish: c.finish_reason, content: c.message.content,
  calls: c.message.tool_calls.map((t) => ({ id: t.id, type: t.type, name: t.function.name,
    args: JSON.parse(t.function.arguments) })) };

// the client's stream helper accumulates delta.tool_calls into the final message
const stream = client.beta.chat.completions.stream({ model, tools, messages });
const final = await stream.finalChatCompletion();
const f = final.choices[0];
out.stream = { finish: f.finish_reason,
  calls: f.message.tool_calls.map((t) => ({ name: t.function.name, args: JSON.parse(t.function.arguments) })) };

// the answer goes back as a tool turn, and the history renders
const next = await client.chat.completions.create({ model, tools, messages: [...messages, c.message,
  { role: "tool", tool_call_id: c.message.tool_calls[0].id, content: "21 C" }] });
out.next = { finish: next.choices[0].finish_reason };
console.log(JSON.stringify(out));
