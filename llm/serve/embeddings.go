package serve

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/embed"
)

// MaxEmbeddingInputs bounds the texts of one /v1/embeddings request (OpenAI's limit).
const MaxEmbeddingInputs = 2048

// embeddingRequest is OpenAI's POST /v1/embeddings body.
type embeddingRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat string          `json:"encoding_format"`
	Dimensions     *int            `json:"dimensions"`
	User           string          `json:"user"`
}

type embeddingData struct {
	Object    string `json:"object"`
	Index     int    `json:"index"`
	Embedding any    `json:"embedding"` // []float32, or a base64 string of little-endian float32s
}

type embeddingResponse struct {
	Object string          `json:"object"`
	Data   []embeddingData `json:"data"`
	Model  string          `json:"model"`
	Usage  struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

// embeddingInputs reads input as OpenAI takes it: a string, an array of strings, an array of
// token ids or an array of such arrays. Texts are encoded with the model's BOS, as it was
// trained; token arrays are taken as they are.
func (s *Server) embeddingInputs(raw json.RawMessage) ([][]int32, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, badRequest("input", "invalid_value", "input is required")
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return [][]int32{s.tok.Encode(one, true)}, nil
	}
	var texts []string
	if json.Unmarshal(raw, &texts) == nil {
		out := make([][]int32, len(texts))
		for i, t := range texts {
			out[i] = s.tok.Encode(t, true)
		}
		return out, nil
	}
	var ids []int32
	if json.Unmarshal(raw, &ids) == nil {
		return [][]int32{ids}, nil
	}
	var lists [][]int32
	if json.Unmarshal(raw, &lists) == nil {
		return lists, nil
	}
	return nil, badRequest("input", "invalid_value", "input must be a string, an array of strings, an array of token ids or an array of such arrays")
}

// embeddings answers POST /v1/embeddings: each input's embedding from the server's Embedder
// (made on the engine's device at the first request), as floats or base64.
func (s *Server) embeddings(w http.ResponseWriter, r *http.Request) *apiError {
	var q embeddingRequest
	if e := decodeRequest(r, &q, nil); e != nil {
		return e
	}
	if q.Model != s.cfg.name {
		return newError(http.StatusNotFound, "invalid_request_error", "model", "model_not_found",
			"the model %q does not exist; this server serves %q", q.Model, s.cfg.name)
	}
	if q.EncodingFormat != "" && q.EncodingFormat != "float" && q.EncodingFormat != "base64" {
		return badRequest("encoding_format", "invalid_value", "encoding_format %q: float or base64", q.EncodingFormat)
	}
	dim := s.mdl.Config.Dim
	if q.Dimensions != nil && *q.Dimensions != dim {
		return badRequest("dimensions", "unsupported_value",
			"dimensions %d: this model's embeddings have %d (they are not truncated)", *q.Dimensions, dim)
	}
	inputs, e := s.embeddingInputs(q.Input)
	if e != nil {
		return e
	}
	if len(inputs) == 0 || len(inputs) > MaxEmbeddingInputs {
		return badRequest("input", "invalid_value", "%d inputs: must be 1 to %d", len(inputs), MaxEmbeddingInputs)
	}
	for i, ids := range inputs {
		param := fmt.Sprintf("input[%d]", i)
		if len(ids) == 0 {
			return badRequest(param, "invalid_value", "%s is empty", param)
		}
		if len(ids) > s.ctxLen {
			return badRequest(param, "context_length_exceeded", "%s has %d tokens; the context holds %d", param, len(ids), s.ctxLen)
		}
		if e := s.checkIDs(param, ids); e != nil {
			return e
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.timeout)
	defer cancel()
	emb, err := s.embedder(ctx)
	if err != nil {
		return newError(http.StatusInternalServerError, "server_error", "", "embedder",
			"preparing the embedding graphs: %v", err)
	}
	resp := embeddingResponse{Object: "list", Model: s.cfg.name, Data: make([]embeddingData, len(inputs))}
	for i, ids := range inputs {
		v, err := emb.Embed(ctx, ids)
		switch {
		case err != nil && ctx.Err() != nil:
			return newError(http.StatusGatewayTimeout, "server_error", "", "timeout",
				"the embeddings were not done within the request timeout (%s)", s.cfg.timeout)
		case errors.Is(err, core.ErrInvalidArgument) || errors.Is(err, llm.ErrContextFull):
			return badRequest(fmt.Sprintf("input[%d]", i), "invalid_value", "%v", err)
		case err != nil:
			return newError(http.StatusInternalServerError, "server_error", "", "", "embedding input %d: %v", i, err)
		case !finite(v):
			return newError(http.StatusInternalServerError, "server_error", "", "", "the embedding of input %d is not finite", i)
		}
		d := embeddingData{Object: "embedding", Index: i, Embedding: v}
		if q.EncodingFormat == "base64" {
			d.Embedding = base64.StdEncoding.EncodeToString(core.EncodeF32(v))
		}
		resp.Data[i] = d
		resp.Usage.PromptTokens += len(ids)
	}
	resp.Usage.TotalTokens = resp.Usage.PromptTokens
	writeJSON(w, http.StatusOK, resp)
	return nil
}

// embedder is the server's Embedder, prepared at the first embeddings request: a server that
// never embeds pays nothing for it.
func (s *Server) embedder(ctx context.Context) (*embed.Embedder, error) {
	s.embedMu.Lock()
	defer s.embedMu.Unlock()
	if s.embed != nil {
		return s.embed, nil
	}
	e, err := embed.FromEngine(ctx, s.eng)
	if err != nil {
		return nil, err
	}
	s.embed = e
	return e, nil
}

// closeEmbedder releases the embedder, if one was made.
func (s *Server) closeEmbedder() error {
	s.embedMu.Lock()
	defer s.embedMu.Unlock()
	if s.embed == nil {
		return nil
	}
	err := s.embed.Close()
	s.embed = nil
	return err
}

// finite reports whether every value of v is a finite number (JSON has no NaN).
func finite(v []float32) bool {
	for _, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return false
		}
	}
	return true
}
