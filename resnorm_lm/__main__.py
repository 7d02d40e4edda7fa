import sys

from resnorm_lm.cli import main

sys.exit(main())
