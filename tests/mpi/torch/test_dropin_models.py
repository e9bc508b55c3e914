"""Two models in one script, each under its own ``hvd.DistributedOptimizer`` given the same drop-in
compression attribute, as a Horovod user writes ``compression=Compression.sketch`` (a GAN's
generator and discriminator): each trains bit for bit as it would alone, since each use of the
attribute is a compression of its own, whose inferred steps and tensor states are that optimizer's."""
import pytest
import torch

from hvdsketch.torch import Compression

STEPS = 6
ROWS = 200


class Trainer:
    """One model (an embedding and a linear layer, the same shapes for both models, so the drop-in's
    names by shape meet) under its own Horovod optimizer; model ``which`` looks up ``8 + 24 * which``
    rows a batch, so its sketch is sized for its own unions."""

    def __init__(self, hvd, which: int, flag: str) -> None:
        torch.manual_seed(which)
        self.hvd, self.which, self.step = hvd, which, 0
        self.model = torch.nn.Sequential(torch.nn.Embedding(ROWS, 8), torch.nn.Linear(8, 4))
        named = [(f"model{which}.{name}", p) for name, p in self.model.named_parameters()]
        compression = Compression.sketch if flag == "sketch" else Compression.from_spec(flag)
        self.optimizer = self.hvd.DistributedOptimizer(torch.optim.SGD(self.model.parameters(), lr=0.5),
                                                       named_parameters=named, compression=compression)

    def train_step(self) -> None:
        rng = torch.Generator().manual_seed(1000 * self.which + 10 * self.step + self.hvd.rank())
        rows = torch.randint(0, ROWS, (8 + 24 * self.which,), generator=rng)
        target = torch.randn(len(rows), 4, generator=rng)
        self.optimizer.zero_grad()
        torch.nn.functional.mse_loss(self.model(rows), target).backward()
        self.optimizer.step()
        self.step += 1

    def parameters(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.model.parameters()]


@pytest.mark.parametrize("flag", ["sketch", "sketch:error=0.5,density=0.2", "randomk:ratio=0.3"])
def test_two_models_under_their_own_optimizers_train_as_each_would_alone(hvd, flag):
    alone = []
    for which in (0, 1):
        trainer = Trainer(hvd, which, flag)
        for _ in range(STEPS):
            trainer.train_step()
        alone.append(trainer.parameters())
    pair = [Trainer(hvd, which, flag) for which in (0, 1)]
    for _ in range(STEPS):
        for trainer in pair:  # interleaved, as a GAN's two optimizers step
            trainer.train_step()
    for trainer, expected in zip(pair, alone):
        for got, want in zip(trainer.parameters(), expected):
            assert torch.equal(got, want), f"model {trainer.which} differs from its run alone ({flag})"
