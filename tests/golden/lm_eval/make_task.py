#!/usr/bin/env python3
"""Writes items.jsonl, the local multiple-choice task of the lm-eval check (run.sh beside this file).

The items are written here, not copied from any dataset: short English facts a 135M model mostly
knows (opposites, capitals, sequences, animal sounds, colours, plurals, small sums), each with its
right continuation and three distractors drawn from the same category with a fixed seed, so the
file is the same on every run. Each line: {"id", "category", "question", "choices": [4 strings, no leading
space: the task puts one between question and choice], "answer": index of the right one}. Usage: make_task.py [OUT] (default: items.jsonl
beside this script).
"""
import json
import random
import sys
from pathlib import Path

# (category, question template, [(fill, answer), ...]); the answer pool of a category is its distractors
CATEGORIES = [
    ("opposite", "The opposite of {} is", [
        ("hot", "cold"), ("up", "down"), ("big", "small"), ("day", "night"), ("fast", "slow"),
        ("happy", "sad"), ("open", "closed"), ("left", "right"), ("old", "young"), ("black", "white"),
    ]),
    ("capital", "The capital city of {} is", [
        ("France", "Paris"), ("Italy", "Rome"), ("Germany", "Berlin"), ("Spain", "Madrid"),
        ("Japan", "Tokyo"), ("Russia", "Moscow"), ("Egypt", "Cairo"), ("England", "London"),
        ("Greece", "Athens"), ("China", "Beijing"),
    ]),
    ("weekday", "Today is {}, so tomorrow is", [
        ("Monday", "Tuesday"), ("Tuesday", "Wednesday"), ("Wednesday", "Thursday"), ("Thursday", "Friday"),
        ("Friday", "Saturday"), ("Saturday", "Sunday"), ("Sunday", "Monday"),
    ]),
    ("month", "The month that comes after {} is", [
        ("January", "February"), ("March", "April"), ("May", "June"), ("July", "August"),
        ("September", "October"), ("November", "December"), ("April", "May"), ("August", "September"),
    ]),
    ("count", "Counting up: {},", [
        ("one, two, three", "four"), ("two, three, four", "five"), ("five, six, seven", "eight"),
        ("six, seven, eight", "nine"), ("seven, eight, nine", "ten"), ("three, four, five", "six"),
        ("four, five, six", "seven"),
    ]),
    ("sound", "The {} goes", [
        ("dog", "woof"), ("cat", "meow"), ("cow", "moo"), ("duck", "quack"), ("sheep", "baa"),
        ("owl", "hoot"), ("snake", "hiss"), ("lion", "roar"),
    ]),
    ("colour", "The colour of {} is", [
        ("grass", "green"), ("the clear sky", "blue"), ("snow", "white"), ("coal", "black"),
        ("a ripe banana", "yellow"), ("blood", "red"), ("an orange", "orange"), ("chocolate", "brown"),
    ]),
    ("plural", "One {}, two", [
        ("mouse", "mice"), ("child", "children"), ("foot", "feet"), ("tooth", "teeth"), ("man", "men"),
        ("goose", "geese"), ("woman", "women"), ("person", "people"),
    ]),
    ("sum", "Question: What is {}?\nAnswer:", [
        ("2 + 2", "4"), ("1 + 2", "3"), ("3 + 3", "6"), ("5 + 2", "7"), ("4 + 4", "8"),
        ("6 + 3", "9"), ("1 + 1", "2"), ("5 + 5", "10"),
    ]),
]

N_CHOICES = 4
SEED = 20  # issue 20


def make_items():
    rng = random.Random(SEED)
    items = []
    for cat, template, pairs in CATEGORIES:
        pool = sorted({a for _, a in pairs})
        for fill, answer in pairs:
            distractors = rng.sample([a for a in pool if a != answer], N_CHOICES - 1)
            choices = distractors + [answer]
            rng.shuffle(choices)
            items.append({
                "id": len(items),
                "category": cat,
                "question": template.format(fill),
                "choices": choices,
                "answer": choices.index(answer),
            })
    return items


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "items.jsonl"
    items = make_items()
    with open(out, "w", encoding="utf-8") as f:
        for it in items:
            f.write(json.dumps(it, ensure_ascii=False) + "\n")
    print(f"make_task: {len(items)} items -> {out}")


if __name__ == "__main__":
    main()
