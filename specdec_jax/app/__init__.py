"""The application on top of the library: the main command and what it needs.

Modules:
  generate       the main command (`python -m specdec_jax.generate`,
                 `specdec-generate`): every method on the bundled family
  demo           what the main command runs on toy Markov models when no
                 bundle is present
  toy            those toy models (a Markov target and an EAGLE-style
                 drafter with exact laws), also used by the engine's tests
  family         the bundled Fashion-MNIST model family (load, write_bundle)
  fashion_mnist  the Fashion-MNIST data (installed IDX files, checked, padded)
  images         image grids with method and class labels, PNG writing
  font           the 5x7 pixel font of those labels
  evaluation     Frechet distance, class accuracy, NLL
  training       the training loop pieces shared by the entry points in `train`
  train          training entry points (tokenizers, target and draft GPTs,
                 EAGLE drafter, classifier, the whole family), run as
                 `python -m specdec_jax.app.train.<name>`

It imports the core, `specdec_jax.models`, `specdec_jax.converters` and
`specdec_jax.configs`; nothing below imports it.
"""
