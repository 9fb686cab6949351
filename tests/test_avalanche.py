"""Avalanche integration: a Lightning loop over a train_stream, and the plugin form, agree."""

import torch
from helpers import analytic_model, toy_tensors

from lightning_unlearn import ACUStrategy, AnalyticRecorder, ForgetRequest
from lightning_unlearn.avalanche import UnlearningPlugin, class_incremental_benchmark, fit_stream


def test_fit_stream_and_plugin_give_the_same_head_and_requests():
    x, y = toy_tensors(400)
    xt, yt = toy_tensors(100, seed=9)
    bm = class_incremental_benchmark(x, y, xt, yt, n_experiences=4, seed=0)
    first_class = int(bm.classes_order[0])
    others = torch.nonzero(y != first_class).flatten()[:2]
    schedule = {1: [ForgetRequest.of_class(first_class)], 3: [ForgetRequest.samples(others)]}

    model, rec = analytic_model(), AnalyticRecorder(gamma=0.5)
    results = fit_stream(model, bm.train_stream, callbacks=[rec], strategy=ACUStrategy(model, rec), schedule=schedule,
                         trainer_kwargs={"enable_progress_bar": False})
    assert [r.request for r in results] == [schedule[1][0], schedule[3][0]]
    assert len(rec.catalog) == 400 and rec.catalog.experiences.unique().tolist() == [0, 1, 2, 3]
    assert torch.equal(results[0].removed_ids.sort().values, torch.nonzero(y == first_class).flatten())

    from avalanche.training import Naive

    model2, rec2 = analytic_model(), AnalyticRecorder(gamma=0.5)
    plugin = UnlearningPlugin(rec2, ACUStrategy(model2, rec2), schedule)
    naive = Naive(model2, torch.optim.SGD(model2.head.parameters(), lr=0.0), torch.nn.CrossEntropyLoss(),
                  train_mb_size=32, train_epochs=2, plugins=[plugin], evaluator=None)
    for experience in bm.train_stream:
        naive.train(experience)
    assert len(plugin.results) == 2
    assert torch.allclose(rec2.W, rec.W, rtol=0, atol=1e-10)
