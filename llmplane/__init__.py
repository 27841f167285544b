"""llmplane: declare LLMs in YAML, run their model servers, route OpenAI traffic to the best replica."""

__version__ = "0.1.0"
