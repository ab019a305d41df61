try:
    from memfit.cli import main
except KeyboardInterrupt:  # Ctrl-C while memfit is still importing: quiet, as in main()
    raise SystemExit(130) from None

raise SystemExit(main())
