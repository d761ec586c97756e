"""Other tokenizer APIs over a kimi_tok Tokenizer: the ``tiktoken.Encoding`` drop-in and the
reference encoding (``tiktoken_compat``), and a Hugging Face ``tokenizer.json`` (``hf``)."""
