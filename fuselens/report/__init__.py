"""`fuselens report` and its views of a `fuselens.events.Report`.

Each renderer is a pure function of the report (no torch, no I/O except the
`dot` subprocess that lays out graph pictures):

    terminal.render_terminal(report, width=100, color=False, quiet=False, root=None) -> str
    json_format.render_json(report) -> str          # exactly Report.to_json()
    markdown.render_markdown(report, root=None) -> str
    html.render_html(report, root=None) -> str      # one self-contained file
    sarif.render_sarif(report, root=None) -> str    # SARIF 2.1.0 for code scanning

`cli.main(argv)` is the command; `cli.render(report, fmt)` picks a renderer.
"""
