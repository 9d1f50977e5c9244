# The findings: every number the figures' claims computed, collected into results/numbers.json
# and results/numbers.tex (one LaTeX macro per number), and the findings pages rendered from
# their templates in docs/templates/ (`make findings` copies them into README.md and docs/).
# The appendix a paper can include (`make appendix`) is built from the same files.


rule numbers:
    input:
        [f"figures/claims/{fig}.json" for fig in FIGURES],
    output:
        json="results/numbers.json",
        tex="results/numbers.tex",
    log:
        "logs/numbers.log",
    conda:
        "../envs/attnquery.yaml"
    script:
        "../scripts/write_numbers.py"


rule findings:
    input:
        numbers="results/numbers.json",
        templates=FINDINGS_TEMPLATES,
    output:
        [f"results/findings/{Path(t).name}" for t in FINDINGS_TEMPLATES],
    log:
        "logs/findings.log",
    conda:
        "../envs/attnquery.yaml"
    script:
        "../scripts/render_findings.py"


rule appendix:
    """Target: appendix/appendix.tex, the figures, tables and numbers as a paper's appendix
    (`make appendix` also compiles it when TeX is installed)."""
    input:
        records=[f"figures/claims/{fig}.json" for fig in FIGURES],
        figures=[f"figures/{fig}.pdf" for fig in FIGURES],
        tables=[f"results/tables/{name}.tex" for name in ENABLED],
        numbers="results/numbers.json",
        numbers_tex="results/numbers.tex",
        results="results/all.parquet",
    output:
        tex="appendix/appendix.tex",
        body="appendix/body.tex",
    params:
        config=lambda w: canonical(config),
    log:
        "logs/appendix.log",
    conda:
        "../envs/attnquery.yaml"
    script:
        "../scripts/write_appendix.py"
