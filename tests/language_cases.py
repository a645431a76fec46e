"""Programs every language runs the same way, shared by the language tests and the language benchmark."""

from __future__ import annotations

# Reads an integer from stdin and prints twice it.
DOUBLE = {
    "python": "print(int(input()) * 2)",
    "bash": "read n; echo $((n * 2))",
    "cpp": "#include <iostream>\nint main(){int n; std::cin >> n; std::cout << n * 2 << std::endl;}",
    "java": "import java.util.*;\nimport org.javatuples.Pair;\npublic class Main { public static void main(String[] a) {"
            " Pair<Integer, Integer> p = Pair.with(new Scanner(System.in).nextInt(), 2);"
            " System.out.println(p.getValue0() * p.getValue1()); } }",
    "nodejs": 'const _ = require("lodash");\nconst n = parseInt(require("fs").readFileSync(0, "utf8"));'
              "\nconsole.log(_.sum([n, n]));",
    "typescript": 'import * as fs from "fs";\nimport _ from "lodash";\n'
                  'const n: number = parseInt(fs.readFileSync(0, "utf8"));\nconsole.log(_.sum([n, n]));',
    "rust": "use std::io::Read;\nfn main(){ let mut s = String::new(); std::io::stdin().read_to_string(&mut s).unwrap();"
            " let n: i64 = s.trim().parse().unwrap(); println!(\"{}\", n * 2); }",
    "perl": 'use Test::Deep;\nuse Data::Compare;\nmy $n = <STDIN>; print $n * 2, "\\n";',
    "go": 'package main\nimport "fmt"\nfunc main(){ var n int; fmt.Scan(&n); fmt.Println(n * 2) }',
    "php": 'echo intval(fgets(STDIN)) * 2, "\\n";',
    "ruby": "puts gets.to_i * 2",
    "lua": 'local lu = require("luaunit")\nprint(io.read("n") * 2)',
    "R": 'n <- as.integer(readLines(file("stdin"), n = 1))\ncat(n * 2, "\\n")',
    "racket": "#lang racket\n(displayln (* 2 (read)))",
    "csharp": "public class Program { public static void Main(string[] args) {"
              " Console.WriteLine(Convert.ToInt32(Console.ReadLine()) * 2); } }",
    "D_ut": "import std.stdio, std.conv, std.string;\nvoid main() { writeln(readln().strip.to!int * 2); }",
    "scala": "object Main { def main(args: Array[String]): Unit = println(scala.io.StdIn.readLine().trim.toInt * 2) }",
    "kotlin_script": "println(readLine()!!.trim().toInt() * 2)",
    "sql": "SELECT 21 * 2;",
    "verilog": 'module tb; integer n; initial begin n = 21; $display("%0d", n * 2); $finish; end endmodule',
}
# The language's own test runner: one passing and one failing suite each (after SF's own tests).
GO_TEST = ('package main\nimport (\n"testing"\n"github.com/stretchr/testify/assert"\n)\n'
           "func Double(n int) int {{ return {body} }}\n"
           "func TestDouble(t *testing.T) {{ assert.Equal(t, 42, Double(21)) }}\n")
JUNIT = ("import org.junit.jupiter.api.Test;\nimport static org.junit.jupiter.api.Assertions.*;\n"
         "public class Doubler {{ public static int twice(int n) {{ return {body}; }} }}\n"
         "class DoublerTest {{ @Test void twice() {{ assertEquals(42, Doubler.twice(21)); }} }}\n")
JEST = ("import {{ describe, expect, test }} from '@jest/globals';\n"
        "function twice(n: number): number {{ return {body}; }}\n"
        "describe('twice', () => {{ test('doubles', () => {{ expect(twice(21)).toBe(42); }}); }});\n")
PYTEST = "def twice(n):\n    return {body}\n\ndef test_twice():\n    assert twice(21) == 42\n"
D_UT = "int twice(int n) {{ return {body}; }}\nunittest {{ assert(twice(21) == 42); }}\nvoid main() {{}}\n"
GTEST = ("#include <gtest/gtest.h>\nint twice(int n) {{ return {body}; }}\n"
         "TEST(Twice, Doubles) {{ EXPECT_EQ(42, twice(21)); }}\n")
TEST_RUNNERS = {"gtest": GTEST, "go_test": GO_TEST, "junit": JUNIT, "jest": JEST, "pytest": PYTEST, "D_ut": D_UT}
