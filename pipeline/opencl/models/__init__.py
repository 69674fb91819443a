"""OpenCL latency models (LLMPerf, sections III-IV): a fine-tuned pretrained encoder on the
paper's prompts (lm), a small transformer from scratch on the same prompts (scratch), and
gradient-boosted trees on static Clang-AST features (trees). torch is allowed here; dagster is not."""
