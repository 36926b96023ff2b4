reverse_lines() { tac "$1"; }
