"""Stand-ins for the tests and benchmarks, importable from both: a scripted OpenAI-compatible server
(scripted_server), training runs against it disturbed (disturbed) and Qwen2.5's exact tokenizer
built without a model hub (qwen25_tokenizer). No part of training or evaluation imports them."""
