"""The built-in ``policy=tiny`` model family: a small PyTorch transformer and a char tokenizer."""
