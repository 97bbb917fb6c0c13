"""The teaching method: prompts and formats, generation, the reward and its scoring and pairing."""
