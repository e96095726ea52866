"""A small GPT-2 built from a config (random weights, nothing downloaded),
run for two sequence lengths: the second recompiles."""
import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=64)
model = GPT2LMHeadModel(config).eval()
compiled = torch.compile(model, backend="eager")

if __name__ == "__main__":
    with torch.no_grad():
        for length in (8, 12):
            input_ids = torch.randint(0, 256, (1, length))
            logits = compiled(input_ids).logits
    print("logits", tuple(logits.shape))
