import pytest

from txtasks import ConfigurationError, Constant, Custom, Exponential, Linear
from txtasks.retry import as_strategy


def test_constant_and_linear() -> None:
    assert [Constant(2).delay(n) for n in (1, 5)] == [2, 2]
    assert [Linear(base=1, step=2, cap=6).delay(n) for n in (1, 2, 3, 9)] == [1, 3, 5, 6]


def test_exponential_without_jitter_doubles_up_to_the_cap() -> None:
    strategy = Exponential(base=0.5, factor=2, cap=3, jitter=False)
    assert [strategy.delay(n) for n in (1, 2, 3, 4, 100)] == [0.5, 1, 2, 3, 3]


def test_exponential_full_jitter_stays_below_the_ceiling() -> None:
    strategy = Exponential(base=1, factor=2, cap=100, jitter=True)
    draws = [strategy.delay(4) for _ in range(500)]
    assert all(0 <= d <= 8 for d in draws)
    assert len(set(draws)) > 100  # really random, not a constant


def test_custom_and_coercions() -> None:
    assert Custom(lambda n: n * 10).delay(3) == 30
    assert isinstance(as_strategy(None), Exponential)
    assert as_strategy(1.5).delay(7) == 1.5
    assert as_strategy(lambda n: 4).delay(1) == 4


@pytest.mark.parametrize(
    ("make", "setting"),
    [
        (lambda: Constant(-1), "seconds"),
        (lambda: Linear(step=-1), "step"),
        (lambda: Exponential(factor=0.5), "factor"),
        (lambda: Custom(lambda n: -1).delay(1), "custom delay"),
        (lambda: as_strategy("soon"), "retry"),  # type: ignore[arg-type]
    ],
)
def test_bad_settings_name_the_setting(make, setting) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigurationError, match=setting):
        make()
