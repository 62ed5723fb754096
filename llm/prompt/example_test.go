package prompt_test

import (
	"fmt"
	"log"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/prompt"
	"github.com/xpuhub/xpu/llm/synth"
	"github.com/xpuhub/xpu/llm/tokenizer"
)

// A template renders a conversation with the generation prompt; the tokenizer gives it the
// model's bos_token and eos_token (here a small synthetic model's, parsed from memory).
func ExampleTemplate_Render() {
	tiny, _ := synth.Preset("llama", "260K", core.F32, 42)
	f, err := synth.Parse(tiny)
	if err != nil {
		log.Fatal(err)
	}
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		log.Fatal(err)
	}
	tmpl, err := prompt.New(tok, "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
	if err != nil {
		log.Fatal(err)
	}
	text, err := tmpl.Render([]prompt.Message{{Role: "user", Content: "Hi!"}}, true)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(text)
	// Output:
	// <|im_start|>user
	// Hi!<|im_end|>
	// <|im_start|>assistant
}
