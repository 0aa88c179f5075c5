import sys

from services.cli.main import main

sys.exit(main())
