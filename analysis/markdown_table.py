"""Tables of runs and verdicts as Markdown, the form docs/ and the reports print."""


def markdown_table(rows: list[dict[str, str]]) -> str:
    """A markdown table with the first row's keys as its header."""
    columns = list(rows[0])
    lines = [f"| {' | '.join(columns)} |", f"|{'---|' * len(columns)}"]
    cells = [[str(row[column]).replace("|", "\\|") for column in columns] for row in rows]
    return "\n".join(lines + [f"| {' | '.join(row)} |" for row in cells])
