"""The accuracy-drop rule of a QDQ file is not applied to a searched model no better than chance
(hwnas.export.verify.at_chance): such a model has no accuracy to lose, and flips on its
near-tied logits would fail the rule on noise (a one-epoch fbnet smoke run: 11.70 % -> 8.08 %)."""

from hwnas.export.verify import at_chance


def test_chance_level_models_are_exempt_and_trained_ones_are_not():
    assert at_chance(11.70, 359, 10)   # the smoke run's searched model (chance 10 %)
    assert at_chance(9.0, 1000, 10)    # below chance
    assert not at_chance(30.0, 359, 10)
    assert not at_chance(90.0, 1000, 10)
    # the same accuracy is at chance for 10 classes and far above it for 100
    assert at_chance(11.0, 1000, 10) and not at_chance(11.0, 1000, 100)


def test_more_images_make_a_small_lead_over_chance_significant():
    assert at_chance(12.0, 200, 10)
    assert not at_chance(12.0, 20000, 10)
