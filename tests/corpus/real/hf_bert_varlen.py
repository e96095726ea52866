"""Fine-tuning with batches padded to their longest sequence, and an eval pass under no_grad."""
import torch
import transformers

torch.manual_seed(0)
cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128,
                              vocab_size=500, num_labels=3)
model = transformers.BertForSequenceClassification(cfg)
model = torch.compile(model, backend="eager")
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)


def batch(seq_len):
    ids = torch.randint(1, 500, (4, seq_len))
    return ids, torch.ones_like(ids), torch.randint(0, 3, (4,))


for step, seq_len in enumerate([16, 24, 32, 40, 48]):
    ids, mask, labels = batch(seq_len)
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    opt.step()
    opt.zero_grad()

model.eval()
with torch.no_grad():
    ids, mask, labels = batch(20)
    print("eval loss", float(model(input_ids=ids, attention_mask=mask, labels=labels).loss))
