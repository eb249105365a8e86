"""One module per ``mirrorkit`` command; each imports TensorFlow only inside its body."""
