# Every figure: one rule, driven by the figure registry of attnquery.figures (the experiments a
# figure reads, its report category and caption). A figure is re-rendered when its tables or
# the code that draws it change.


rule plot_figure:
    input:
        figure_tables,
    output:
        pdf=report(
            "figures/{figure}.pdf",
            caption="../report/figure.rst",
            category=lambda w: get_spec(w.figure).category,
            labels={"figure": "{figure}"},
        ),
        png="figures/{figure}.png",
        claims="figures/claims/{figure}.rst",
        numbers="figures/claims/{figure}.json",
    params:
        code=figure_code,
        caption=lambda w: get_spec(w.figure).caption,
        claims=lambda w: ClaimsText(f"figures/claims/{w.figure}.rst"),
        experiments=lambda w: canonical({e: section(e) for e in get_spec(w.figure).reads(ENABLED)}),
    log:
        "logs/figures/{figure}.log",
    conda:
        "../envs/attnquery.yaml"
    script:
        "../scripts/plot_figure.py"


rule figures:
    """Target: every figure and table, brought up to date (`make figures`)."""
    input:
        [f"figures/{fig}.{ext}" for fig in FIGURES for ext in ("pdf", "png")],
        [f"results/tables/{name}.tex" for name in ENABLED],
