package jinja_test

import (
	"testing"

	"github.com/xpuhub/xpu/internal/jinja"
)

// benchTemplate is one template and the data it renders in the benchmarks.
type benchTemplate struct {
	name   string
	source string
	data   map[string]any
}

// benchTemplates goes from plain variable substitution to the heaviest chat
// template, Gemma 4 on a multi-turn tool-calling conversation. It is a
// function because chatTemplates is filled in by init, after package-level
// variables.
func benchTemplates() []benchTemplate {
	return []benchTemplate{
		{name: "Simple", source: "Hello {{ name }}!", data: map[string]any{"name": "World"}},
		{name: "Qwen3", source: chatTemplates["Qwen3-8B-Q8_0"], data: weatherChat(true)},
		// The hybrid model used by kronk's benchmarks.
		{name: "Qwen36", source: chatTemplates["Qwen3.6-35B-A3B-UD-Q4_K_M"], data: weatherChat(true)},
		{name: "Gemma4", source: chatTemplates["gemma-4-26B-A4B-it-UD-Q8_K_XL"], data: multiTurnToolChat()},
	}
}

func BenchmarkCompile(b *testing.B) {
	for _, bt := range benchTemplates() {
		b.Run(bt.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := jinja.Compile(bt.source); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkRender(b *testing.B) {
	for _, bt := range benchTemplates() {
		b.Run(bt.name, func(b *testing.B) {
			tmpl, err := jinja.Compile(bt.source)
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if _, err := tmpl.Render(bt.data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
