from prober.cli import main

main()
