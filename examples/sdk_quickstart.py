"""The TypeSafe quickstart against Hunch with the official SDK, unchanged.

    pip install "typesafe-sdk[zstd]==0.7.5"
    TYPESAFE_BASE_URL=http://127.0.0.1:8080 TYPESAFE_API_KEY=unused python examples/sdk_quickstart.py
"""

import typesafe_sdk as ts

client = ts.TypeSafeClient()
result = client.system_one(
    "Hi, I was charged twice for my subscription this month and the app keeps crashing. "
    "I need this fixed today.",
    {
        "team": ts.Choice(
            instructions="Which team should handle this",
            criteria={
                "billing": "Payment or subscription issues",
                "technical": "Bugs, errors, or product not working",
                "sales": "Questions about buying or upgrading",
            },
        ),
        "frustration": ts.Score(
            instructions="How frustrated the customer appears",
            criteria=["Calm, just stating facts", "Mildly annoyed", "Very frustrated or angry"],
        ),
        "urgent": ts.Noul(instructions="The message conveys urgency or time-sensitivity"),
    },
)
print("model:", result.model)
for key, answer in result.answers.items():
    print(key, answer)
