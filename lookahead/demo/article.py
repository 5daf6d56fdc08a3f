"""The article `lookahead demo` asks a chat model to summarize: a news-style account of a real event (Voyager 1
leaving the heliosphere, announced by NASA in September 2013), written for this project from public facts and
released with it under its license."""

TITLE = "Voyager 1 has left the solar bubble, scientists say"

ARTICLE = """Voyager 1 has left the solar bubble, scientists say

NASA's Voyager 1 spacecraft has become the first human-made object to travel into interstellar space, the agency
announced on Thursday, more than 35 years after the probe was launched from Cape Canaveral in Florida.

The spacecraft, now about 19 billion kilometres from the Sun, crossed the boundary of the heliosphere, the vast
bubble of charged particles that the Sun blows around itself, in August 2012. Scientists needed more than a year
to be sure. The decisive evidence came from the plasma wave instrument on board, which measured vibrations in the
dense, cold gas that surrounds the spacecraft. Those vibrations, set off when eruptions on the Sun sent shock waves
outward, showed that Voyager 1 is now moving through gas about forty times denser than the gas inside the
heliosphere. That is what researchers had long expected to find in the space between the stars.

"We literally jumped out of our seats when we saw these oscillations in our data," said one member of the team that
analysed the measurements, which were published in the journal Science.

The finding settles a debate that had run for months. The magnetic field around the probe did not change direction
when it crossed the boundary, as many models had predicted, which led some researchers to argue that the spacecraft
was still inside a transition region. The plasma measurements convinced most of the team that the crossing had
already happened.

Voyager 1 was launched on 5 September 1977, sixteen days after its twin, Voyager 2. Both flew past Jupiter and
Saturn and sent back close-up pictures of the giant planets and their moons. Voyager 2 went on to visit Uranus and
Neptune and is expected to reach interstellar space in the coming years.

The two spacecraft are powered by generators that turn the heat of decaying plutonium into electricity. Their
power output falls every year, and engineers have switched off heaters and instruments one by one to keep the
remaining science instruments running. Mission managers expect to keep collecting data until around 2025.

Signals from Voyager 1, travelling at the speed of light, take about 17 hours to reach Earth. The spacecraft also
carries a gold-plated record with sounds and images of life on Earth, in case it is ever found by someone else.

"Voyager has boldly gone where no probe has gone before," said the mission's project scientist. "Now that we are in
interstellar space, we can study it directly for the first time."
"""
