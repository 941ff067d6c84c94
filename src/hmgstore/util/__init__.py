"""Small utilities every layer may use: which device a table lives on (:mod:`.device`), timing GPU work and the
PCIe limit (:mod:`.timing`), progress bars (:mod:`.progress`), and how busy the machine's cores are
(:mod:`.cpu_load`)."""
