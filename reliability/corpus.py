"""The few passages every probe of the suite indexes (short, two sentences each: sentence tables are exercised)."""

TEXTS = ["Coral reefs bleach when the water warms. Algae leave the coral.",
         "The Great Barrier Reef is the largest reef system. It lies off Australia.",
         "Ocean acidification weakens coral skeletons. Carbon dioxide dissolves in seawater.",
         "Fish shelter in reefs. Many species depend on them.",
         "Sea turtles graze on seagrass. They nest on sandy beaches.",
         "Mangroves protect coasts from storms. Their roots trap sediment."]
