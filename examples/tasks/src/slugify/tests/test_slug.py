import unittest

from textkit import slugify


class SlugifyTest(unittest.TestCase):
    def test_punctuation_and_case(self):
        self.assertEqual(slugify("Hello, World!"), "hello-world")

    def test_runs_of_spaces(self):
        self.assertEqual(slugify("  many   spaces here "), "many-spaces-here")

    def test_already_slug(self):
        self.assertEqual(slugify("plain-slug"), "plain-slug")


if __name__ == "__main__":
    unittest.main()
